"""The training loop of a heal: deterministic for a seed, resumable, cached.

* What is trained (``recipe.part``), always on a *private* copy of the (pruned) model: its own tensors, so the
  caller's model never changes.  ``lora``: LoRA through ``peft`` (``LoraConfig`` + ``get_peft_model``) on every
  linear layer of the kept blocks (peft freezes the base weights and ``merge_and_unload`` writes into them);
  ``last-k``: the last k kept blocks and lm_head in full, everything else frozen (with tied embeddings lm_head
  *is* the input embedding matrix, and it is trained).  The "adapter" below is the trained tensors either way.
* The loss (``recipe.objective``): the LM loss, or the KD loss against the unpruned model's top-k teacher
  (:mod:`swapkl.healing.teacher`), or their mix.
* Determinism: the LoRA initialisation runs under ``torch.manual_seed(seed)`` (the global RNG state is restored
  afterwards); the batch of update ``s`` is a pure function of (seed, s) (:func:`batch_indices`); dropout draws
  from the RNG seeded with ``seed + 1`` whose state goes into every checkpoint.
* Checkpoints (adapter weights + AdamW state + RNG state + step + losses) every ``recipe.checkpoint_every``
  updates and when stopped, each written atomically (:func:`swapkl.store.atomic_write_bytes`) and named by a
  checksummed store entry written after it, so a ``kill -9`` at any instant leaves the previous complete
  checkpoint; a rerun resumes from it to bit-identical weights.
* The finished adapter is cached under ``<cache>/heal/<key>/`` (key: model fingerprint, removed set, recipe,
  training text), so nothing trains twice; its checkpoints are then deleted.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import io
import time
import warnings
from pathlib import Path
from typing import Callable

import torch

from swapkl.contract import stable_hash
from swapkl.errors import ComputeInterrupted, ContractError, require_extra
from swapkl.healing.recipe import Recipe
from swapkl.model import architectures as arch
from swapkl.store import CorruptEntry, atomic_write_bytes, cache_root, read_entry, write_entry
from swapkl.surgery.blocks import pruned_copy
from swapkl.model.projections import is_conv1d

CKPT_KIND = "heal-checkpoint"
ADAPTER_KIND = "heal-adapter"


# ------------------------------------------------------------------------------------------------ model set-up
def model_fingerprint(model: torch.nn.Module) -> str:
    """sha256 (first 32 hex digits) of every parameter's name, dtype, shape and bytes: the weights themselves."""
    h = hashlib.sha256()
    for name, p in model.state_dict().items():
        t = p.detach().to("cpu").contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()[:32]


def private_copy(model: torch.nn.Module, removed) -> torch.nn.Module:
    """The model without blocks ``removed``, with its own parameter tensors (a deep copy)."""
    return copy.deepcopy(pruned_copy(model, list(removed))).eval()


def lora_targets(model: torch.nn.Module) -> tuple[list[str], bool]:
    """(the names of every linear layer inside the blocks, whether they are GPT-2 ``Conv1D`` layers)."""
    blocks = arch.locate(model).blocks
    prefix = next(n for n, m in model.named_modules() if m is blocks)
    names, conv = [], False
    for n, m in model.named_modules():
        if n.startswith(prefix + ".") and (isinstance(m, torch.nn.Linear) or is_conv1d(m)):
            names.append(n)
            conv = conv or is_conv1d(m)
    if not names:
        raise ContractError("the model's blocks have no linear layers to put LoRA on")
    return names, conv


def lora_model(model: torch.nn.Module, recipe: Recipe):
    """``get_peft_model`` on ``model`` (changed in place: pass a private copy) with the recipe's LoRA; the
    initialisation is seeded by ``recipe.seed`` (B = 0, so the LoRA model starts equal to ``model``)."""
    require_extra("heal", "healing (LoRA fine-tuning)")
    from peft import LoraConfig, get_peft_model

    names, conv = lora_targets(model)
    cfg = LoraConfig(r=recipe.rank, lora_alpha=recipe.alpha, lora_dropout=recipe.dropout, target_modules=names,
                     bias="none", fan_in_fan_out=conv, task_type="CAUSAL_LM")
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # peft asks transformers a deprecated question
        torch.manual_seed(recipe.seed)
        return get_peft_model(model, cfg)


def last_k_model(model: torch.nn.Module, k: int) -> torch.nn.Module:
    """``model`` (changed in place: pass a private copy) with every parameter frozen except those of its last
    ``k`` blocks and of lm_head (the output embedding; with tied embeddings, the shared matrix)."""
    blocks = arch.locate(model).blocks
    if k > len(blocks):
        raise ContractError(f"--k {k} is more than the {len(blocks)} blocks the pruned model keeps")
    for p in model.parameters():
        p.requires_grad_(False)
    for p in blocks[len(blocks) - k:].parameters():
        p.requires_grad_(True)
    head = model.get_output_embeddings()
    if head is None:
        raise ContractError("--train last-k trains lm_head, and this model has no output embedding to train")
    head.weight.requires_grad_(True)
    return model


def start_copy(model: torch.nn.Module, removed, bridges=None) -> torch.nn.Module:
    """What a heal starts from, as a private copy: ``model`` without ``removed``, or with ``bridges`` (a
    ``--repair bridge`` heal) the bridged model (:func:`swapkl.repair.bridge.bridged_model`; its constant maps)."""
    if not bridges:
        return private_copy(model, removed)
    from swapkl.repair.bridge import bridged_model

    return copy.deepcopy(bridged_model(model, list(bridges))).eval()


def trainable_model(model: torch.nn.Module, removed, recipe: Recipe, bridges=None) -> torch.nn.Module:
    """The model that trains: a private copy of ``model`` without ``removed`` (with ``bridges``: the bridged model),
    with the recipe's trained part (LoRA, QLoRA on CUDA, the last k blocks and lm_head, or LoRA and the bridge
    matrices: :func:`swapkl.healing.bridged.attach_maps`)."""
    if recipe.part == "bridge" and bridges:
        from swapkl.healing.bridged import attach_maps

        pm = lora_model(private_copy(model, removed), recipe)
        attach_maps(pm.get_base_model(), bridges, arch.locate(model).num_layers)
        return pm
    if recipe.part == "last-k":
        return last_k_model(start_copy(model, removed, bridges), recipe.last_k)
    if recipe.qlora and bridges:
        raise ContractError("--qlora does not combine with --repair bridge")
    if recipe.qlora:  # the 4-bit base on CUDA (swapkl.healing.qlora); the adapter merges into full precision
        from swapkl.healing.qlora import quantized_copy

        return lora_model(quantized_copy(model, removed), recipe)
    return lora_model(start_copy(model, removed, bridges), recipe)


def trainable(pm) -> list[tuple[str, torch.nn.Parameter]]:
    return [(n, p) for n, p in pm.named_parameters() if p.requires_grad]


def adapter_state(pm) -> dict[str, torch.Tensor]:
    return {n: p.detach().to("cpu").clone() for n, p in trainable(pm)}


def load_adapter_state(pm, state: dict) -> None:
    params = dict(trainable(pm))
    if set(params) != set(state):
        raise CorruptEntry("the adapter does not fit this model")
    with torch.no_grad():
        for n, p in params.items():
            p.copy_(state[n].to(p.device, p.dtype))


@functools.lru_cache(maxsize=4)
def _epoch_order(n_chunks: int, seed: int, epoch: int) -> tuple[int, ...]:
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return tuple(torch.randperm(n_chunks, generator=g).tolist())


def batch_indices(step: int, n_chunks: int, batch: int, seed: int) -> torch.Tensor:
    """The chunk indices of update ``step``: the training chunks in a seeded random order, epoch after epoch
    (epoch e: ``randperm(n_chunks)`` of a generator seeded with (seed, e)); a pure function of its arguments."""
    out = []
    for pos in range(step * batch, (step + 1) * batch):
        epoch, k = divmod(pos, n_chunks)
        out.append(_epoch_order(n_chunks, seed, epoch)[k])
    return torch.tensor(out, dtype=torch.long)


# ------------------------------------------------------------------------------------------------ the store
def heal_dir(fingerprint: str, removed, recipe: Recipe, text_key: str) -> Path:
    key = stable_hash({"model": fingerprint, "removed": sorted(int(i) for i in removed), "recipe": recipe.key(),
                       "text": text_key})[:24]
    return cache_root() / "heal" / key


def _save_tensors(folder: Path, name: str, obj) -> str:
    buf = io.BytesIO()
    torch.save(obj, buf)
    data = buf.getvalue()
    atomic_write_bytes(folder / name, data)
    return hashlib.sha256(data).hexdigest()


def _load_tensors(folder: Path, entry: dict):
    f = folder / entry["file"]
    data = f.read_bytes()
    if hashlib.sha256(data).hexdigest() != entry["sha256"]:
        raise CorruptEntry(f"{f.name}: checksum mismatch")
    return torch.load(io.BytesIO(data), weights_only=True)


def read_cached(folder: Path, kind: str, recipe: Recipe):
    """(entry, tensors) of a finished adapter or a checkpoint in ``folder``, or None (missing or damaged)."""
    try:
        entry = read_entry(folder / f"{kind}.json", kind)
        if entry is None or entry.get("recipe_key") != recipe.key():
            return None
        return entry, _load_tensors(folder, entry)
    except (CorruptEntry, OSError, RuntimeError, KeyError, ValueError):
        return None


def _write_checkpoint(folder: Path, step: int, pm, opt, losses: list, recipe: Recipe, old: str | None) -> str:
    name = f"checkpoint-{step}.pt"
    sha = _save_tensors(folder, name, {"adapter": adapter_state(pm), "optimizer": opt.state_dict(),
                                       "rng": torch.get_rng_state(), "step": step})
    write_entry(folder / f"{CKPT_KIND}.json", CKPT_KIND, {"step": step, "file": name, "sha256": sha,
                                                          "recipe_key": recipe.key(), "losses": list(losses)})
    if old and old != name:
        with contextlib.suppress(OSError):
            (folder / old).unlink()
    return name


# ------------------------------------------------------------------------------------------------ training
def loss_of(pm, x: torch.Tensor, recipe: Recipe, teacher=None) -> torch.Tensor:
    """The recipe's loss on the batch ``x`` ((B, T) ids): LM (next-token cross-entropy, mean over the B (T − 1)
    predicted tokens), KD (:func:`swapkl.healing.teacher.kd_loss` against ``teacher.batch(x)``), or
    ``kd_weight`` KD + (1 − ``kd_weight``) LM."""
    if recipe.objective == "lm":
        return pm(input_ids=x, labels=x, use_cache=False).loss
    from swapkl.healing.teacher import kd_loss

    logits = pm(input_ids=x, use_cache=False).logits
    kd = kd_loss(logits, teacher.batch(x), recipe.temperature)
    if recipe.objective == "kd":
        return kd
    lm = torch.nn.functional.cross_entropy(logits[:, :-1].float().flatten(0, 1), x[:, 1:].flatten())
    return recipe.kd_weight * kd + (1.0 - recipe.kd_weight) * lm


def train(model: torch.nn.Module, removed, chunks: torch.Tensor, recipe: Recipe, folder: Path | None = None,
          progress: Callable | None = None, should_stop: Callable | None = None, teacher=None,
          bridges=None) -> tuple[dict, dict]:
    """Train the recipe's part (LoRA or the last k blocks) on a private copy of ``model`` without ``removed``
    over ``chunks`` ((N, T) ids) with the recipe's objective.

    Returns (adapter state {name: tensor}, stats).  With ``folder``: a finished adapter there is returned at once
    (``stats["cached"]``); else training resumes from its last checkpoint, writes one every
    ``recipe.checkpoint_every`` updates, and stores the finished adapter.  ``progress(step, steps, message)``
    after every update; ``should_stop()`` before each: a checkpoint is written, then
    :class:`~swapkl.errors.ComputeInterrupted`.  ``teacher``: a :class:`swapkl.healing.teacher.Teacher` for the
    KD objectives (default: the unpruned ``model``'s, in memory).  ``bridges``: a ``--repair bridge`` heal starts from
    the bridged model (:func:`start_copy`; ``--train bridge`` trains the matrices too, their names in the state)."""
    recipe.validate()
    if folder is not None and (hit := read_cached(folder, ADAPTER_KIND, recipe)) is not None:
        return hit[1], dict(hit[0]["stats"], cached=True)
    if recipe.distills and teacher is None:
        from swapkl.healing.teacher import Teacher

        teacher = Teacher(model, recipe.temperature, recipe.top_k)
    pm = trainable_model(model, removed, recipe, bridges)
    dev = next(p for _, p in trainable(pm)).device
    params = [p for _, p in trainable(pm)]
    # fused: one kernel for all LoRA tensors (CPU and CUDA); the textbook loop's per-tensor update is slower
    opt = torch.optim.AdamW(params, lr=recipe.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=recipe.weight_decay,
                            fused=dev.type in ("cpu", "cuda"))
    start, losses, ckpt = 0, [], None
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(recipe.seed + 1)
        if folder is not None and (hit := read_cached(folder, CKPT_KIND, recipe)) is not None:
            entry, state = hit
            load_adapter_state(pm, state["adapter"])
            opt.load_state_dict(state["optimizer"])
            torch.set_rng_state(state["rng"])
            start, losses, ckpt = int(state["step"]), list(entry["losses"]), entry["file"]
        t0 = time.perf_counter()
        pm.train()
        for step in range(start, recipe.steps):
            if should_stop is not None and should_stop():
                if folder is not None:
                    _write_checkpoint(folder, step, pm, opt, losses, recipe, ckpt)
                raise ComputeInterrupted(f"healing stopped at step {step} of {recipe.steps}; a rerun resumes there")
            for g in opt.param_groups:
                g["lr"] = recipe.lr_at(step)
            x = chunks[batch_indices(step, len(chunks), recipe.batch, recipe.seed)].to(dev)
            loss = loss_of(pm, x, recipe, teacher)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(float(loss.detach()))
            if folder is not None and (step + 1) % recipe.checkpoint_every == 0 and step + 1 < recipe.steps:
                ckpt = _write_checkpoint(folder, step + 1, pm, opt, losses, recipe, ckpt)
            if progress is not None:
                progress(step + 1, recipe.steps, f"step {step + 1}/{recipe.steps} loss {losses[-1]:.4f}")
        seconds = time.perf_counter() - t0
    pm.eval()
    trained = recipe.steps - start
    stats = {"steps": recipe.steps, "resumed_from": start, "seconds": seconds,
             "tokens_per_s": trained * recipe.batch * recipe.seq_len / seconds if trained and seconds > 0 else None,
             "loss_first": losses[0] if losses else None, "loss_last": losses[-1] if losses else None,
             "losses": losses, "trainable_params": sum(p.numel() for p in params), "cached": False,
             "objective": recipe.objective, "trained": recipe.to_dict()["target"]}
    if teacher is not None:
        stats["teacher_chunks_computed"] = teacher.computed
    state = adapter_state(pm)
    if folder is not None:
        sha = _save_tensors(folder, "adapter.pt", state)
        write_entry(folder / f"{ADAPTER_KIND}.json", ADAPTER_KIND, {"file": "adapter.pt", "sha256": sha,
                                                                    "recipe_key": recipe.key(), "stats": stats})
        for f in folder.glob("checkpoint-*.pt"):
            with contextlib.suppress(OSError):
                f.unlink()
        with contextlib.suppress(OSError):
            (folder / f"{CKPT_KIND}.json").unlink()
    return state, stats


def healed_model(model: torch.nn.Module, removed, recipe: Recipe, state: dict, adapter_dir: Path | None = None,
                 bridges=None):
    """The healed model: a private copy of ``model`` without ``removed``, the adapter ``state`` loaded and merged
    into its weights (``merge_and_unload``; ``last-k``: the trained tensors loaded in place).  ``adapter_dir``:
    also save the LoRA adapter alone there (peft folder; nothing for ``last-k``, whose tensors are the model's).
    The ``kd`` control (no layer removed, empty ``state``) is a copy of the base: distilling toward itself is the
    identity, so it is never trained.  ``bridges``: the heal started from the bridged model; with ``--train bridge``
    the trained matrices are folded into their projections (folded form) or stay hooked (residual form), and no
    separate adapter is written (:func:`swapkl.healing.bridged.merge_with_maps`)."""
    if recipe.objective == "kd" and not list(removed) and not state:
        return private_copy(model, []).eval()
    if recipe.part == "bridge" and bridges:
        from swapkl.healing.bridged import merge_with_maps

        pm = trainable_model(model, removed, recipe, bridges)
        load_adapter_state(pm, state)
        return merge_with_maps(pm, bridges, arch.locate(model).num_layers)
    if recipe.part == "last-k":
        m = last_k_model(start_copy(model, removed, bridges), recipe.last_k)
        load_adapter_state(m, state)
        for p in m.parameters():
            p.requires_grad_(True)
        return m.eval()
    pm = lora_model(start_copy(model, removed, bridges), recipe)
    load_adapter_state(pm, state)
    if adapter_dir is not None:
        pm.save_pretrained(str(adapter_dir))
    return pm.merge_and_unload().eval()
