"""A sublayer layout found on the loaded model, for a block whose modules carry other names than the layouts of
:data:`swapkl.model.units.LAYOUTS` (``ln_attn``, ``attention``, ``feed_forward``, ``w2`` ...).

Found from one unmodified forward per block structure (a dense block and an MoE block are two), with hooks on that
block's direct children, not from ``model_type``:

* the **attention core** is the first child called that holds projections and whose name says attention (``attn``,
  ``attention``), the **MLP core** the first such child called after it whose name says feed-forward (``mlp``,
  ``feed_forward``, ``ffn``); a parallel block's one shared norm (GPT-J, Falcon, Phi, Cohere) belongs to attention;
* every other child that holds weights is a **norm of one of them**: called before the attention core, it is
  attention's; called between the two, it is attention's when it reads the attention core's output (a post-norm,
  Gemma's sandwich) and the MLP's otherwise (the pre-MLP norm); called after the MLP core, it is the MLP's when it
  reads the MLP core's output;
* each core's **output projection** is its last projection (a module with a 2-D weight, ``Linear`` or GPT-2's
  ``Conv1D``) called whose output is as wide as the block's input; an MoE feed-forward's are its experts' stacked
  down projections (``experts.down_proj`` ``[E, d, I]`` and its bias) and its shared expert's last projection.

The result is a :class:`~swapkl.model.layouts.UnitLayout` named ``found``; :func:`swapkl.model.units.validate_layout`
then checks it like any other (the two units partition every block's weights; with both projections zeroed a block
is the identity), and :func:`skip_error` checks on the model that skipping each unit (its core's output replaced by
zeros, its own norms by the identity, as :mod:`swapkl.surgery.skip` does) equals zeroing its projection: a block
whose attention adds the residual inside its module (BLOOM) fails here.  A block whose feed-forward keeps its
output in fused weights of other names, a child that holds weights but is called nowhere, a core that returns a
tuple of another length than attention's pair, or structures whose cores and norms differ (attention beside
linear attention) is not described: the caller gets the reason in one line.
"""
from __future__ import annotations

import torch

from swapkl.contract import SUBLAYERS
from swapkl.model import knowledge
from swapkl.model.layouts import SublayerSpec, UnitLayout, representatives, zero_out

#: the words a child's name says attention or feed-forward by (data/generic.json)
ATTENTION_WORDS = knowledge.strings("generic", "attention_words")
MLP_WORDS = knowledge.strings("generic", "mlp_words")
#: the names MoE experts give their stacked down projections (``[E, d, I]`` parameters and their biases)
EXPERT_OUTS = knowledge.strings("generic", "expert_outs")


def _has_words(name: str, words: tuple[str, ...]) -> bool:
    low = name.lower()
    return any(w in low for w in words)


def _is_projection(mod: torch.nn.Module) -> bool:
    w = getattr(mod, "weight", None)
    return isinstance(w, torch.Tensor) and w.dim() == 2 and not isinstance(mod, torch.nn.Embedding)


def _first_tensor(x):
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, (tuple, list)) and x and isinstance(x[0], torch.Tensor):
        return x[0]
    return None


def _probe_ids(model: torch.nn.Module, seed: int) -> torch.Tensor:
    """One short random prompt inside the model's vocabulary, ``[1, 6]`` token ids on the model's device."""
    V = int(getattr(model.config.get_text_config(), "vocab_size", 0) or 16)
    ids = torch.randint(3, max(4, min(V, 200)), (1, 6), generator=torch.Generator().manual_seed(seed))
    return ids.to(next(model.parameters()).device)


def _record(model: torch.nn.Module, block: torch.nn.Module) -> tuple[list, dict, int]:
    """``(calls, projections, width)``: ``block``'s direct children in call order as ``(name, input,
    output)``, the projections of every child in call order ``{child: [(path, output width)]}``, the block's
    input width."""
    calls: list = []
    projections: dict[str, list] = {}
    width: list[int] = []
    handles = [block.register_forward_pre_hook(
        lambda m, a, k: width.append(int((a[0] if a else k["hidden_states"]).shape[-1])) if not width else None,
        with_kwargs=True)]
    for name, child in block.named_children():
        def hook(mod, args, kwargs, out, name=name):
            x = args[0] if args else next((v for v in kwargs.values() if isinstance(v, torch.Tensor)), None)
            if not any(c[0] == name for c in calls):
                calls.append((name, x, out))
        handles.append(child.register_forward_hook(hook, with_kwargs=True))
        for path, sub in child.named_modules():
            if path and _is_projection(sub):
                def proj(mod, args, out, name=name, path=path):
                    t = _first_tensor(out)
                    if t is not None:
                        projections.setdefault(name, []).append((f"{name}.{path}", int(t.shape[-1])))
                handles.append(sub.register_forward_hook(proj))
    ids = _probe_ids(model, seed=0)
    try:
        with torch.inference_mode():
            model(input_ids=ids, use_cache=False)
    finally:
        for h in handles:
            h.remove()
    return calls, projections, (width[0] if width else 0)


def find_layout(model: torch.nn.Module, blocks) -> UnitLayout | str:
    """The layout of ``model``'s blocks found as the module docstring says, or why there is none (one line).
    Found on one block of each structure (dense and MoE blocks): their cores and norms must agree; the output
    projections are those of all of them (a path a block lacks is not zeroed there)."""
    found = [_block_layout(model, blocks[k]) for k in representatives(blocks)]
    why = next((f for f in found if isinstance(f, str)), None)
    if why is not None:
        return why
    first = found[0]
    if any((f.attention.modules, f.mlp.modules) != (first.attention.modules, first.mlp.modules) for f in found):
        return "its blocks differ in their sublayer modules"
    specs = {u: first.spec(u) for u in SUBLAYERS}
    for u, spec in specs.items():
        outs = tuple(dict.fromkeys(p for f in found for p in f.spec(u).out))
        specs[u] = SublayerSpec(spec.modules, outs, spec.core, spec.shared)
    return UnitLayout("found", *(specs[u] for u in SUBLAYERS), notes=first.notes)


def _block_layout(model: torch.nn.Module, block: torch.nn.Module) -> UnitLayout | str:
    """The layout of one block (see the module docstring), or why there is none."""
    try:
        calls, projections, width = _record(model, block)
    except Exception as e:  # a forward that the hooks' model cannot run: no layout
        return f"its forward could not be recorded ({type(e).__name__})"
    names = [c[0] for c in calls]
    att = next((n for n in names if _has_words(n, ATTENTION_WORDS) and n in projections), None)
    if att is None:
        return "no child of a block named as attention with projections is called"
    mlp = next((n for n in names[names.index(att) + 1:] if _has_words(n, MLP_WORDS) and n in projections), None)
    if mlp is None:
        return "no child named as a feed-forward with projections is called after the attention"
    out = {c[0]: c[2] for c in calls}
    units: dict[str, list[str]] = {att: [], mlp: []}
    ia, im = names.index(att), names.index(mlp)
    for k, (name, x, _) in enumerate(calls):
        if name in (att, mlp) or not any(True for _ in block.get_submodule(name).parameters()):
            continue
        if k < ia:
            units[att].append(name)
        elif k < im:
            units[att if x is _first_tensor(out[att]) else mlp].append(name)
        elif x is _first_tensor(out[mlp]):
            units[mlp].append(name)
        else:
            return f"'{name}' runs after the feed-forward on another input than its output"
    for name, child in block.named_children():
        if name not in names and any(True for _ in child.parameters()):
            return f"'{name}' holds weights but is not called"
    specs = {}
    attention, feed_forward = SUBLAYERS
    for unit, core in zip(SUBLAYERS, (att, mlp)):
        wide = [path for path, w in projections.get(core, []) if w == width]
        experts = [f"{core}.{n}" for n, prm in block.get_submodule(core).named_parameters()
                   if n.rpartition(".")[2] in EXPERT_OUTS and prm.dim() >= 2] if unit == feed_forward else []
        if not wide and not experts:
            return f"'{core}' has no projection back to the block's width (fused weights)"
        result = out[core]
        if isinstance(result, (tuple, list)) and (unit == feed_forward or len(result) != 2):
            return f"'{core}' returns a tuple of {len(result)} (a skipped {unit} could not stand in for it)"
        if unit == attention and not isinstance(result, (tuple, list)):
            return f"'{core}' returns a tensor, not attention's (output, weights) pair"
        shared = tuple(n for n in units[core] if out[n] is not None and all(
            c[1] is _first_tensor(out[n]) for c in calls if c[0] in (att, mlp)))
        specs[unit] = SublayerSpec(_ordered(units[core], core, names), (*experts, *wide[-1:]), core, shared)
    return UnitLayout("found", *(specs[u] for u in SUBLAYERS),
                      notes=f"found on the model: attention '{att}', feed-forward '{mlp}'")


def _ordered(norms: list[str], core: str, names: list[str]) -> tuple[str, ...]:
    """The unit's modules in call order: its norms and its core."""
    return tuple(sorted([*norms, core], key=names.index))


def _model_logits(model, ids) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=ids, use_cache=False).logits.float()


def skip_error(model: torch.nn.Module, blocks, layout: UnitLayout) -> str | None:
    """None when, for each unit of one block of each structure, the model with the unit skipped (hooks: the core
    returns zeros shaped as its output, the unit's own norms return their input) gives the same logits as the model
    with the unit's projections zeroed, else why not.  The model is restored before returning."""
    import copy

    ids = _probe_ids(model, seed=1)
    for k, unit in [(k, u) for k in representatives(blocks) for u in SUBLAYERS]:
        block = blocks[k]
        spec = layout.spec(unit)
        probe = copy.deepcopy(block)
        zero_out(probe, layout, unit)
        blocks[k] = probe
        try:
            zeroed = _model_logits(model, ids)
        finally:
            blocks[k] = block

        def core_hook(mod, args, out):
            t = _first_tensor(out)
            z = torch.zeros_like(t)
            return (z, None) if isinstance(out, (tuple, list)) else z

        def norm_hook(mod, args, kwargs, out):
            return args[0] if args else next(v for v in kwargs.values() if isinstance(v, torch.Tensor))

        handles = [block.get_submodule(spec.core).register_forward_hook(core_hook)]
        handles += [block.get_submodule(n).register_forward_hook(norm_hook, with_kwargs=True)
                    for n in spec.modules if n != spec.core and n not in spec.shared]
        try:
            skipped = _model_logits(model, ids)
        except Exception as e:  # a skipped core the block cannot take
            return f"the block fails with its {unit} skipped ({type(e).__name__})"
        finally:
            for h in handles:
                h.remove()
        tol = 1e-4 * max(1.0, zeroed.abs().max().item())
        if (zeroed - skipped).abs().max().item() > tol:
            return f"skipping its {unit} is not zeroing '{spec.out[0]}' (the module adds more than its branch)"
    return None
