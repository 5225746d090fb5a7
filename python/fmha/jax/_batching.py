"""vmap of the dense and neighborhood calls: the vmapped axis folded into the batch, one call.

Under jax.vmap an FFI call would otherwise run once per element (the handlers' fallback,
vmap_method="sequential"). Here the forward and backward calls are jax.custom_batching.custom_vmap
functions whose rule reshapes every operand from [V, B, ...] to [V * B, ...] and the results back:

- an operand that is not vmapped is broadcast to [V, B, ...] first (a copy: q, k and v of one
  element are read by every element, and the C++ layer's batch stride cannot express "repeat B
  rows V times");
- a bias with batch 1 that is not vmapped stays as it is in the forward (the C++ layer
  broadcasts it over all V * B rows); where its gradient is needed it is broadcast to the batch
  too, since each vmapped element owns its own dbias (summed over its batch here);
- sinks have no batch axis: dsinks of each element is computed here from the call's out, lse,
  dout and dlse (SPEC §11: dsinks[h] = -sum over b, i of exp(sinks[h] - lse) * Delta), a
  reduction of the size of out; vmapped sinks (a different [H] per element) run element by
  element (jax.lax.map).

merge_attentions folds every operand the same way (all have the batch first). Varlen calls are not
folded (their batch is the offsets); they run element by element.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.custom_batching import custom_vmap

_BIAS, _SINKS = 0, 3  # positions in the optional inputs (bias, rel_h, rel_w, sinks, extra_k, extra_v)


def _fold(x, batched: bool, size: int, batch: int):
    """x ([V, batch, ...] or, unbatched, [batch, ...]) as [V * batch, ...]."""
    if not batched:
        x = jnp.broadcast_to(x, (size, *x.shape))
    return x.reshape(size * batch, *x.shape[2:])


def _unfold(x, size: int):
    return x.reshape(size, x.shape[0] // size, *x.shape[1:])


def _fold_bias(bias, batched: bool, size: int, batch: int, own_gradient: bool):
    """(folded bias, batch of the folded bias per element). A batch-1 bias that is not vmapped
    and needs no per-element gradient is left as it is: the C++ layer broadcasts it."""
    bias_batch = bias.shape[1] if batched else bias.shape[0]
    if not batched and bias_batch == 1 and not own_gradient:
        return bias, None
    if not batched:
        bias = jnp.broadcast_to(bias, (size, *bias.shape))
    if bias_batch != batch:  # batch 1 against a larger batch: one row per folded element
        bias = jnp.broadcast_to(bias, (size, batch, *bias.shape[2:]))
    return bias.reshape(-1, *bias.shape[2:]), bias_batch


def _sequential(fn, in_batched, args):
    """fn over the vmapped axis one element at a time."""
    leaves, tree = jax.tree.flatten(args)
    flags = jax.tree.leaves(in_batched)
    mapped = [x for x, b in zip(leaves, flags) if b]

    def one(xs):
        it = iter(xs)
        return fn(*jax.tree.unflatten(tree, [next(it) if b else x for x, b in zip(leaves, flags)]))

    out = jax.lax.map(one, mapped)
    return out, jax.tree.map(lambda _: True, out)


def forward(call, q, k, v, optional):
    """call(q, k, v, optional) -> (out, lse), folding a vmapped axis into the batch."""
    present = tuple(x is not None for x in optional)

    def rebuild(arrays):
        it = iter(arrays)
        return tuple(next(it) if p else None for p in present)

    @custom_vmap
    def f(q, k, v, arrays):
        return call(q, k, v, rebuild(arrays))

    @f.def_vmap
    def rule(size, in_batched, q, k, v, arrays):
        q_b, k_b, v_b, arrays_b = in_batched
        opt, opt_b = rebuild(arrays), rebuild(arrays_b)
        if present[_SINKS] and opt_b[_SINKS]:
            return _sequential(f, in_batched, (q, k, v, arrays))
        batch = q.shape[1] if q_b else q.shape[0]
        folded = []
        for i, (x, b) in enumerate(zip(opt, opt_b)):
            if x is None or i == _SINKS:
                folded.append(x)
            elif i == _BIAS:
                folded.append(_fold_bias(x, b, size, batch, own_gradient=False)[0])
            else:
                folded.append(_fold(x, b, size, batch))
        out, lse = call(_fold(q, q_b, size, batch), _fold(k, k_b, size, batch),
                        _fold(v, v_b, size, batch), tuple(folded))  # fmt: skip
        return (_unfold(out, size), _unfold(lse, size)), (True, True)

    return f(q, k, v, tuple(x for x in optional if x is not None))


def _dsinks(sinks, out, lse, dout, dlse):
    """SPEC §11's dsinks per leading element: out / dout [V, B, ..., H, Dv], lse [V, B, H, ...]."""
    stat = lse.dtype
    delta = jnp.sum(out.astype(stat) * dout.astype(stat), axis=-1)  # [V, B, ..., H]
    delta = jnp.moveaxis(delta, -1, 2)  # [V, B, H, ...], as lse
    if dlse is not None:
        delta = delta - dlse.astype(stat)
    sink = sinks.astype(stat).reshape(1, 1, -1, *([1] * (lse.ndim - 3)))
    p_sink = jnp.exp(sink - lse)
    axes = tuple(a for a in range(lse.ndim) if a not in (0, 2))
    return (-jnp.sum(p_sink * delta, axis=axes)).astype(sinks.dtype)


def backward(call, q, k, v, optional, out, lse, dout, dlse, needs):
    """call(q, k, v, optional, out, lse, dout, dlse, needs) -> (dq, dk, dv, optional grads),
    folding a vmapped axis into the batch."""
    present = tuple(x is not None for x in optional)
    has_dlse = dlse is not None

    def rebuild(arrays):
        it = iter(arrays)
        return tuple(next(it) if p else None for p in present)

    def flat(grads):
        dq, dk, dv, optional_grads = grads
        return (dq, dk, dv, tuple(g for g in optional_grads if g is not None))

    @custom_vmap
    def f(q, k, v, out, lse, dout, dlse, arrays):
        return flat(call(q, k, v, rebuild(arrays), out, lse, dout, dlse if has_dlse else None,
                         needs))  # fmt: skip

    @f.def_vmap
    def rule(size, in_batched, q, k, v, out, lse, dout, dlse, arrays):
        args = (q, k, v, out, lse, dout, dlse, arrays)
        q_b, k_b, v_b, out_b, lse_b, dout_b, dlse_b, arrays_b = in_batched
        opt, opt_b = rebuild(arrays), rebuild(arrays_b)
        if present[_SINKS] and opt_b[_SINKS]:
            return _sequential(f, in_batched, args)
        batch = q.shape[1] if q_b else q.shape[0]
        fold = lambda x, b: _fold(x, b, size, batch)  # noqa: E731
        folded, bias_batch = [], None
        for i, (x, b) in enumerate(zip(opt, opt_b)):
            if x is None or i == _SINKS:
                folded.append(x)
            elif i == _BIAS:
                x, bias_batch = _fold_bias(x, b, size, batch, own_gradient=needs[_BIAS])
                folded.append(x)
            else:
                folded.append(fold(x, b))
        # dsinks per element comes from _dsinks, not from the folded call (which sums them all).
        folded_needs = tuple(n and i != _SINKS for i, n in enumerate(needs))
        dq, dk, dv, grads = call(
            fold(q, q_b), fold(k, k_b), fold(v, v_b), tuple(folded), fold(out, out_b),
            fold(lse, lse_b), fold(dout, dout_b), fold(dlse, dlse_b) if has_dlse else None,
            folded_needs,
        )  # fmt: skip
        unfolded = []
        for i, g in enumerate(grads):
            if i == _SINKS and present[i] and needs[i]:
                g = _dsinks(
                    opt[i], *(x if b else jnp.broadcast_to(x, (size, *x.shape))
                              for x, b in ((out, out_b), (lse, lse_b), (dout, dout_b))),
                    (dlse if dlse_b else jnp.broadcast_to(dlse, (size, *dlse.shape)))
                    if has_dlse else None,
                )  # fmt: skip
            elif g is not None:
                g = _unfold(g, size)
                if i == _BIAS and bias_batch is not None and g.shape[1] != bias_batch:
                    g = jnp.sum(g, axis=1, keepdims=True)  # the batch-1 bias of each element
            unfolded.append(g)
        result = flat((_unfold(dq, size), _unfold(dk, size), _unfold(dv, size), tuple(unfolded)))
        return result, jax.tree.map(lambda _: True, result)

    placeholder = dlse if has_dlse else jnp.zeros((), lse.dtype)
    dq, dk, dv, computed = f(q, k, v, out, lse, dout, placeholder,
                             tuple(x for x in optional if x is not None))  # fmt: skip
    it = iter(computed)
    return dq, dk, dv, tuple(next(it) if p and n else None for p, n in zip(present, needs))


def folded(call):
    """call(*arrays) -> arrays, each with the batch first and nothing summed over it (merge):
    under vmap, every operand and result is folded as above."""

    @custom_vmap
    def f(*arrays):
        return call(*arrays)

    @f.def_vmap
    def rule(size, in_batched, *arrays):
        results = call(*(_fold(x, b, size, x.shape[1] if b else x.shape[0])
                         for x, b in zip(arrays, in_batched)))  # fmt: skip
        results = jax.tree.map(lambda r: _unfold(r, size), results)
        return results, jax.tree.map(lambda _: True, results)

    return f
