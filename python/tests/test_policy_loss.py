"""policy_loss in one process (CP 1): the loss, per-position values and both gradients against
the objective written out in torch in fp64 and differentiated by autograd, for every kind,
aggregation and KL estimator with truncated importance sampling, the entropy bonus and the
dual clip; the op's fake and autograd registrations (opcheck), torch.compile, bad input. CP >
1 and DP meshes are proven against the reference in C++ (harness/optimized)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import cpkit

IGNORE = -100
V = 23


def _case(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(2, 11, 6, generator=g)
    weight = torch.randn(V, 6, generator=g) * 0.8
    labels = torch.randint(0, V, (2, 11), generator=g)
    labels[1, 5] = IGNORE
    # Row 0: sequences 1 (0-4) and 2 (5-10); row 1: one sequence, then two padding tokens.
    ids = torch.tensor([[1] * 5 + [2] * 6, [1] * 9 + [0] * 2])
    valid = (labels != IGNORE) & (ids > 0)
    valid[:, 0] = False
    valid[0, 5] = False  # a sequence's first token is no target
    x = torch.randn(4, 2, 11, generator=g)
    x[1:] = x[1:] * 0.7 - math.log(V)  # old, ref and sampler log-probabilities near log(1 / V)
    return hidden, weight, labels, valid.flatten(), ids, x


def _truth(hidden, weight, labels, valid, ids, x, o):
    """The objective of docs/spec.md section 5c in fp64 on one process, and its gradients."""
    h = hidden.double().requires_grad_(True)
    w = weight.double().requires_grad_(True)
    log_p = F.log_softmax(h @ w.T, dim=-1)
    B, L = labels.shape
    v = valid.view(B, L)
    targets = torch.full_like(labels, IGNORE)
    targets[:, :-1] = torch.where(v[:, 1:], labels[:, 1:], IGNORE)
    has = targets != IGNORE
    lp = log_p.gather(-1, targets.clamp_min(0).unsqueeze(-1)).squeeze(-1)
    ent = -(log_p.exp() * log_p).sum(-1)
    a, old, ref, sampler = (t.double() for t in x)
    seq = (torch.arange(B)[:, None] * (L + 1) + ids)[has]  # a (row, id) index per counted one
    n_seq = torch.zeros(B * (L + 1), dtype=torch.float64).index_add(0, seq, torch.ones(len(seq), dtype=torch.float64))
    ratio = torch.exp(lp - old)[has]
    if o["kind"] == "gspo":
        sums = torch.zeros(B * (L + 1), dtype=torch.float64).index_add(0, seq, (lp - old)[has])
        ratio = torch.exp(sums / n_seq.clamp_min(1))[seq]
    a_c = a[has]
    low, high = 1 - o["eps_low"], 1 + o["eps_high"]
    if o["kind"] == "cispo":
        pg = -ratio.clamp(low, high).detach() * a_c * lp[has]
    else:
        pg = torch.maximum(-a_c * ratio, -a_c * ratio.clamp(low, high))
        if o["dual_clip"] > 1:
            pg = torch.where(a_c < 0, torch.minimum(pg, -o["dual_clip"] * a_c), pg)
    if o["tis_cap"] > 0:
        pg = pg * torch.exp(old - sampler)[has].clamp(max=o["tis_cap"])
    d = (ref - lp)[has]
    kl = {"k1": -d, "k2": d * d / 2, "k3": torch.exp(d) - d - 1}[o["kl"]]
    loss = pg + o["kl_coef"] * kl - o["entropy_coef"] * ent[has]
    groups = float((n_seq > 0).sum())
    weights = {"token_mean": torch.full_like(loss, 1 / len(loss)),
               "seq_mean_token_mean": 1 / (groups * n_seq[seq]),
               "seq_mean_token_sum": torch.full_like(loss, 1 / groups),
               "constant": torch.full_like(loss, 1 / o["divisor"])}[o["aggregation"]]
    J = (weights * loss).sum()
    dh, dw = torch.autograd.grad(J, (h, w))
    return J, dh, dw, lp.detach() * has, ratio.detach()


CASES = [
    dict(kind="ppo", aggregation="token_mean", kl="k3", dual_clip=3.0, tis_cap=0.0),
    dict(kind="ppo", aggregation="seq_mean_token_mean", kl="k1", dual_clip=0.0, tis_cap=2.0),
    dict(kind="cispo", aggregation="constant", kl="k2", dual_clip=0.0, tis_cap=2.0),
    dict(kind="cispo", aggregation="seq_mean_token_sum", kl="k3", dual_clip=0.0, tis_cap=0.0),
    dict(kind="gspo", aggregation="seq_mean_token_mean", kl="k3", dual_clip=0.0, tis_cap=0.0),
    dict(kind="gspo", aggregation="token_mean", kl="k2", dual_clip=0.0, tis_cap=2.0),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c['kind']}-{c['aggregation']}")
@pytest.mark.parametrize("chunk_rows", [0, 5])
def test_equals_torch_autograd_in_fp64(case, chunk_rows):
    hidden, weight, labels, valid, ids, x = _case()
    o = dict(eps_low=0.2, eps_high=0.28, kl_coef=0.05, entropy_coef=0.01, divisor=17.0, **case)
    J, dh, dw, lp, ratio = _truth(hidden, weight, labels, valid, ids, x, o)
    h = hidden.clone().requires_grad_(True)
    w = weight.clone().requires_grad_(True)
    r = cpkit.policy_loss(h, w, labels, valid, x[0], x[1], ref_logprobs=x[2],
                          sampler_logprobs=x[3], sequence_ids=ids, chunk_rows=chunk_rows, **o)
    r.loss.backward()
    torch.testing.assert_close(r.loss.double(), J, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(r.logprobs.double(), lp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(r.ratio[r.logprobs != 0].double(), ratio, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(h.grad.double(), dh, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(w.grad.double(), dw, rtol=1e-4, atol=1e-6)


def test_entropy_only_when_asked_for_or_used():
    hidden, weight, labels, valid, ids, x = _case(2)
    log_p = F.log_softmax(hidden.double() @ weight.double().T, dim=-1)
    entropy = -(log_p.exp() * log_p).sum(-1)
    runs = {}
    for asked in (False, True):
        h = hidden.clone().requires_grad_(True)
        w = weight.clone().requires_grad_(True)
        r = cpkit.policy_loss(h, w, labels, valid, x[0], x[1], entropy=asked)
        r.loss.backward()
        runs[asked] = (r, h.grad, w.grad)
    counted = runs[True][0].logprobs != 0
    assert counted.any()
    torch.testing.assert_close(runs[True][0].entropy[counted].double(), entropy[counted],
                               rtol=1e-5, atol=1e-6)
    assert torch.equal(runs[False][0].entropy, torch.zeros_like(runs[False][0].entropy))
    # Skipping the entropy's sums changes nothing else.
    for a, b in zip((runs[False][0].loss, *runs[False][1:]), (runs[True][0].loss, *runs[True][1:])):
        assert torch.equal(a, b)
    with_bonus = cpkit.policy_loss(hidden, weight, labels, valid, x[0], x[1], entropy_coef=0.01)
    torch.testing.assert_close(with_bonus.entropy, runs[True][0].entropy)  # used: returned


def test_opcheck_and_compile():
    hidden, weight, labels, valid, ids, x = _case(1)
    args = (hidden.requires_grad_(True), weight.requires_grad_(True), labels, valid, x[0], x[1],
            x[2], None, ids, "", "", "gspo", 0.2, 0.2, 0.0, "k3", 0.1, 0.0, 0.0,
            "seq_mean_token_mean", 0.0, 0.0, 1.0, "fp32", 0, True, True, None)
    torch.library.opcheck(torch.ops.cpkit.policy_loss.default, args)

    def step(h, w):
        return cpkit.policy_loss(h, w, labels, valid, x[0], x[1], ref_logprobs=x[2],
                                 sequence_ids=ids, kind="gspo", kl_coef=0.1,
                                 aggregation="seq_mean_token_mean").loss

    h = hidden.detach().clone().requires_grad_(True)
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")(h, weight)
    eager = step(hidden.detach(), weight.detach())
    torch.testing.assert_close(compiled, eager)


@pytest.mark.parametrize("change, argument", [
    (dict(kind="grpo"), "kind"),
    (dict(kl="k4"), "kl"),
    (dict(aggregation="mean"), "aggregation"),
    (dict(eps_low=1.5), "eps_low"),
    (dict(kl_coef=0.1), "ref_logprobs"),
    (dict(aggregation="seq_mean_token_sum"), "sequence_ids"),
])
def test_bad_input_names_the_argument(change, argument):
    hidden, weight, labels, valid, ids, x = _case()
    with pytest.raises(cpkit.CPError, match=f"argument '{argument}'"):
        cpkit.policy_loss(hidden, weight, labels, valid, x[0], x[1], **change)


def test_a_nan_advantage_on_a_counted_position_is_named():
    hidden, weight, labels, valid, ids, x = _case()
    advantages = x[0].clone()
    advantages[0, 2] = float("nan")
    with pytest.raises(cpkit.CPError, match="argument 'advantages': is nan at position 2"):
        cpkit.policy_loss(hidden, weight, labels, valid, advantages, x[1])
