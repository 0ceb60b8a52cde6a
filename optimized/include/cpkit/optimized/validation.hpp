// Checks of tensor values. Shapes, dtypes and devices are always checked (no data is read).
// Checks of values (labels inside the vocabulary, no valid bit on a -100 label, no negative
// label other than -100, attention_mask in {0, 1}) read the data on the host: free for CPU
// tensors, but for CUDA tensors each costs a device-to-host copy and a synchronisation of the
// stream, which stalls the token path. The switch says when they run. The ranks' agreement
// tables (shapes, dtypes, plans) are exchanged on every call; the switch also says when a
// CUDA rank reads its table on the host: always where value checks apply, else once per
// (mesh, key); CPU tables are always read (docs/spec.md section 6a).
#pragma once

namespace cpkit {

enum class ValueChecks {
  kCpuOnly,  // default: CPU tensors are checked, CUDA tensors are not
  kAlways,   // CUDA tensors too (a synchronisation per check; for debugging a new pipeline)
  kNever,    // none (a label outside the vocabulary then gives a NaN loss, never a bad read)
};

// Process-wide; read at each call.
void set_value_checks(ValueChecks checks);
ValueChecks value_checks();

}  // namespace cpkit
