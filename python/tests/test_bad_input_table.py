"""The bad-input table shared with C++ (tests/bad_inputs.json): every case through the Python
package raises cpkit.CPError naming the case's argument with each of its fragments, the same
check and message as tests/optimized/bad_input_table_test.cpp sees through the C++ API."""

from __future__ import annotations

import json

import pytest
import torch

import cpkit
from cpkit._errors import translate
from conftest import HERE

TABLE = json.loads((HERE.parents[1] / "tests" / "bad_inputs.json").read_text())
DTYPES = {"float32": torch.float32, "float64": torch.float64, "int64": torch.int64,
          "bool": torch.bool}
CASES = [c for c in TABLE["cases"] if c.get("only") != "cpp"]


def _tensor(spec: dict) -> torch.Tensor:
    dtype = DTYPES[spec["dtype"]]
    if "values" in spec:
        t = torch.tensor(spec["values"], dtype=torch.float64).to(dtype)
    else:
        t = (torch.ones if "ones" in spec else torch.zeros)(
            spec.get("ones", spec.get("zeros")), dtype=dtype)
    if "transpose" in spec:
        t = t.transpose(*spec["transpose"])
    return t.to(spec["device"]) if "device" in spec else t


def _value(v):
    if isinstance(v, str):
        return v
    if isinstance(v, list):
        return [_tensor(s) for s in v]
    return _tensor(v)


def _batch(case: dict) -> dict:
    fields = {**TABLE["batches"][case["batch"]], **case.get("set", {})}
    return {k: _value(v) for k, v in fields.items() if v is not None}


def _loss_input(case: dict, name: str) -> torch.Tensor:
    return _tensor(case.get("set", {}).get(name, TABLE["loss"][name]))


def _head_input(case: dict, name: str) -> torch.Tensor:
    return _tensor(case.get("set", {}).get(name, TABLE["head"][name]))


def _sharder(case: dict) -> cpkit.Sharder:
    call = case["call"]
    prepare = (cpkit.prepare_cp_inputs if call == "prepare_cp_inputs"
               else cpkit.prepare_packed_cp_inputs)  # the other calls take packed rows
    extra = {} if call == "prepare_cp_inputs" else {"balance_slack": case.get("balance_slack")}
    return prepare(_batch(case), case.get("num_chunks", 1), call != "cut_spliced",
                   pad_multiple=case.get("pad_multiple", 1), **extra)


def _run(case: dict) -> None:
    call = case["call"]
    if call == "shifted_cp_loss":
        cpkit.shifted_cp_loss(_loss_input(case, "logits"), _loss_input(case, "labels"),
                              _loss_input(case, "valid"),
                              softcap=float(case.get("softcap", 0.0)))
    elif call == "token_logprobs":
        cpkit.token_logprobs(_head_input(case, "hidden"), _head_input(case, "weight"),
                             _head_input(case, "labels"), _head_input(case, "valid"),
                             softcap=float(case.get("softcap", 0.0)),
                             temperature=float(case.get("temperature", 1.0)),
                             logits_precision=case.get("logits_precision", "fp32"))
    elif call == "policy_loss":
        cpkit.policy_loss(_head_input(case, "hidden"), _head_input(case, "weight"),
                          _head_input(case, "labels"), _head_input(case, "valid"),
                          _head_input(case, "advantages"), _head_input(case, "old_logprobs"),
                          kind=case.get("kind", "ppo"), kl=case.get("kl", "k3"),
                          aggregation=case.get("aggregation", "token_mean"),
                          eps_low=float(case.get("eps_low", 0.2)),
                          dual_clip=float(case.get("dual_clip", 0.0)),
                          kl_coef=float(case.get("kl_coef", 0.0)))
    elif call == "scale_loss_gradient_":  # internal: the raw op, with the package's errors
        translate(torch.ops.cpkit.scale_loss_gradient_)(_tensor(case["grad_logits"]),
                                                        _tensor(case["upstream"]))
    elif call == "gather_tokens":
        cpkit.gather_tokens(_tensor(case["value"]))
    elif call == "local":
        _sharder(case).local(case["microbatch"])
    elif call == "pack_documents":
        cpkit.pack_documents(case["lengths"], case["rows"], case["capacity"],
                             window=case.get("window", 0))
    elif call == "cut_spliced":
        _sharder(case).cut_spliced(0, _tensor(case["spliced"]))
    elif call in ("prepare_cp_inputs", "prepare_packed_cp_inputs"):
        _sharder(case)
    else:
        raise AssertionError(f"no Python twin for call {call!r}: mark the case only: cpp")


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_bad_input_raises_the_named_error(case):
    with pytest.raises(cpkit.CPError) as error:
        _run(case)
    message = str(error.value)
    assert message.startswith(f"cpkit: argument '{case['argument']}':"), message
    for fragment in case["contains"]:
        assert fragment in message, message


def test_every_case_without_a_python_twin_says_why():
    skipped = [c for c in TABLE["cases"] if c.get("only") == "cpp"]
    assert all(c.get("why") for c in skipped), skipped
    assert len(CASES) >= 40  # the table is read, not silently empty
