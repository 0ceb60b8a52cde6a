"""How a torchrun worker of the tests ends (docs/python.md, "Ending a Gloo job")."""

import os
import sys


def run(main) -> None:
    """Runs main() and leaves without Python's finalisation. torch 2.11's Gloo groups have no
    shutdown: their worker threads outlive destroy_process_group while anything references the
    group (a DeviceMesh; torch's dispatch-mode machinery after opcheck or torch.compile), and a
    worker that frees a collective's tensor while Python finalises aborts the process
    ("terminate called without an active exception") after every check passed."""
    main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
