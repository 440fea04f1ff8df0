"""chain_index: a chained drafter round's index columns in one launch, against its torch
reference (the ops `spec/drafter_chain.py` ran before) over odd sizes, every acceptance
count, padding streams and a padded commit bucket."""

import pytest
import torch

from kolibri_trt_plugins import testing as T
from kolibri_trt_plugins.chain_index import chain_index, chain_index_ref


def _case(s, s_b, width, depth, b, seed, n_extra=3, start_min=1):
    """Random fields of s valid streams (of s_b), a step whose drafts are accepted 0 .. k
    times (the target's own tokens equal the leading drafts), buffers poisoned with -7."""
    g = T.gen(seed)
    fields = torch.zeros(5, s_b + 1, dtype=torch.long)
    inputs, own, row = [], [], 0
    for i in range(s):
        k = int(torch.randint(0, width, (1,), generator=g))
        a = int(torch.randint(0, k + 1, (1,), generator=g))
        drafts = torch.randint(0, 500, (k,), generator=g).tolist()
        mine = drafts[:a] + [int(torch.randint(500, 999, (1,), generator=g))] * (k + 1 - a)
        inputs += [int(torch.randint(0, 500, (1,), generator=g))] + drafts
        own += mine
        start = int(torch.randint(start_min, 3000, (1,), generator=g))
        fields[:, i] = torch.tensor([row, k, start, i * 2 % 7, 1])
        row += 1 + k
    t = row + n_extra
    inp = torch.full((t + 4,), 3, dtype=torch.long)
    inp[:row] = torch.tensor(inputs, dtype=torch.long) if inputs else inp[:0]
    own_t = torch.full((t,), 11, dtype=torch.long)
    own_t[:row] = torch.tensor(own, dtype=torch.long) if own else own_t[:0]
    offsets = torch.arange(depth * b, dtype=torch.long).view(depth, b)
    n_b = max(8, 1 << (s_b * width - 1).bit_length())
    r_idx = torch.full((6, depth * s_b * b + 5), -7, dtype=torch.long)
    c_idx = torch.full((6, n_b + 3), -7, dtype=torch.long)
    return fields, inp, own_t, offsets, r_idx, c_idx, n_b


@pytest.mark.parametrize("s,s_b,width,depth,b", [(1, 1, 5, 1, 4), (3, 4, 5, 1, 4),
                                                 (0, 2, 3, 2, 3), (5, 8, 9, 2, 4),
                                                 (7, 8, 2, 1, 1)])
def test_interpreter_equals_reference(interp, s, s_b, width, depth, b):
    """Exact over odd sizes: padding streams, a block size that is not a power of two,
    depth 2, a commit bucket with padding columns; columns past the bucket stay untouched."""
    fields, inp, own, offsets, r_ref, c_ref, n_b = _case(s, s_b, width, depth, b, seed=s + width)
    r_got, c_got = r_ref.clone(), c_ref.clone()
    args = dict(s_b=s_b, n_b=n_b, width=width, ring_size=2057, history_rows=2065, trash=7)
    chain_index_ref(fields, inp, own, offsets, r_ref, c_ref, **args)
    chain_index(fields, inp, own, offsets, r_got, c_got, interpret=True, **args)
    assert torch.equal(r_got, r_ref)
    assert torch.equal(c_got, c_ref)
    assert (c_ref[:, n_b:] == -7).all() and (r_ref[:, depth * s_b * b:] == -7).all()


def test_reference_counts_accepted_drafts():
    """One stream, 4 drafts of which the first 2 equal the target's own tokens: anchor start + 2,
    bonus = the target's token after them, commit rows start - 1 .. start + 1 with the step's
    inputs as next ids, the rest padding."""
    fields = torch.tensor([[0], [4], [100], [3], [1]])
    inp = torch.tensor([50, 60, 70, 80, 90, 0, 0])
    own = torch.tensor([60, 70, 99, 0, 0, 0])
    offsets = torch.arange(4).view(1, 4)
    r, c = torch.zeros(6, 4, dtype=torch.long), torch.zeros(6, 8, dtype=torch.long)
    chain_index_ref(fields, inp, own, offsets, r, c, s_b=1, n_b=8, width=5, ring_size=50,
                    history_rows=40, trash=8)
    assert r[0, 0] == 99 and r[1, 0] == 3 and r[2, 0] == 102 and r[3, 0] == 3 * 40 + 102 % 40
    assert r[4].tolist() == [102, 103, 104, 105] and r[5].tolist() == [2, 3, 4, 5]
    assert c[0, :3].tolist() == [50, 60, 70] and c[2, :3].tolist() == [99, 100, 101]
    assert c[2, 3:].tolist() == [-1] * 5 and c[1, 3:].tolist() == [8] * 5
    assert c[4, 3:].tolist() == [49] * 5


def test_interpreter_floor_remainders(interp):
    """A stream starting at position 0 (its first commit row is position -1): the remainders
    are floor remainders in the kernel as in torch."""
    fields, inp, own, offsets, r_ref, c_ref, n_b = _case(2, 2, 5, 1, 4, seed=9)
    fields[2, 0] = 0
    r_got, c_got = r_ref.clone(), c_ref.clone()
    args = dict(s_b=2, n_b=n_b, width=5, ring_size=13, history_rows=11, trash=7)
    chain_index_ref(fields, inp, own, offsets, r_ref, c_ref, **args)
    chain_index(fields, inp, own, offsets, r_got, c_got, interpret=True, **args)
    assert c_ref[4, 0] == 12 and c_ref[3, 0] == fields[3, 0] * 11 + 10
    assert torch.equal(r_got, r_ref) and torch.equal(c_got, c_ref)


def test_cpu_op_equals_reference():
    fields, inp, own, offsets, r_ref, c_ref, n_b = _case(3, 4, 5, 1, 4, seed=2)
    r_got, c_got = r_ref.clone(), c_ref.clone()
    args = dict(s_b=4, n_b=n_b, width=5, ring_size=2057, history_rows=2065, trash=7)
    chain_index_ref(fields, inp, own, offsets, r_ref, c_ref, **args)
    chain_index(fields, inp, own, offsets, r_got, c_got, **args)
    assert torch.equal(r_got, r_ref) and torch.equal(c_got, c_ref)


def test_errors_name_the_argument():
    fields, inp, own, offsets, r, c, n_b = _case(1, 1, 5, 1, 4, seed=0)
    args = dict(s_b=1, n_b=n_b, width=5, ring_size=50, history_rows=40, trash=8)
    with pytest.raises(ValueError, match="^fields:"):
        chain_index(fields.int(), inp, own, offsets, r, c, **args)
    with pytest.raises(ValueError, match="^s_b:"):
        chain_index(fields, inp, own, offsets, r, c, **{**args, "s_b": 3})
    with pytest.raises(ValueError, match="^n_b, width:"):
        chain_index(fields, inp, own, offsets, r, c, **{**args, "n_b": 4})
    with pytest.raises(ValueError, match="^own, inputs:"):
        chain_index(fields, inp[:3], own, offsets, r, c, **args)
    with pytest.raises(ValueError, match="^c_idx:"):
        chain_index(fields, inp, own, offsets, r, c.t().contiguous().t(), **args)
    with pytest.raises(ValueError, match="^r_idx:"):
        chain_index(fields, inp, own, offsets, r[:, :2], c, **args)
