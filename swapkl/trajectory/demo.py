"""A small training trajectory made on the CPU, for trying the trajectory view without the hub.

:func:`train_demo_trajectory` trains a small GPT-NeoX (the Pythia architecture: parallel residual, rotary on
25 % of each head) from scratch on the prompt region of the built-in corpus (``swapkl.scoring.corpora.builtin()``,
Python's pydoc topics) and saves Hugging Face checkpoints -- ``save_pretrained`` model and tokenizer, loadable
with ``AutoModelForCausalLM`` / ``AutoTokenizer.from_pretrained(folder)`` -- at ``step0`` (the
initialisation, before any update) and at geometrically spaced later steps, plus a ``trajectory.json``
manifest (steps, folders, held-out loss in nats/token).  Default output: ``<cache>/demo-trajectory/``.

The tokenizer is a byte-level BPE (any text tokenizes, no unknown tokens) trained offline with ``tokenizers``
on the same training text.  The held-out text is the corpus's evaluation region (disjoint from training).

Time: ``seconds`` (default 170, so the command with its imports stays under 3 minutes) bounds the whole run.
After the first two updates the step count is planned so the full schedule fits in 85 % of the remaining
time (``steps`` is an upper bound); if the machine slows down later, training stops at the time limit and the
last step reached is saved as the final checkpoint (``stopped_early`` in the manifest).
With the same settings and planned step count the run is deterministic (seeded init, data order and
tokenizer; one thread count).
"""
from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from swapkl.store import atomic_replace_dir, cache_root, temp_folder
from swapkl.errors import ComputeInterrupted, SwapklError
from swapkl.scoring.corpora import builtin

# Deferred imports: torch, transformers and tokenizers are imported by the functions that train: the CLI's --help
# and the dashboard import this module without them.

FORMAT = "swapkl.demo-trajectory/1"
MANIFEST = "trajectory.json"
SPECIAL = "<|endoftext|>"
PLAN_MARGIN = 0.85  # plan the step count to use this share of the time left after two updates


class DemoTrajectoryError(SwapklError):
    """Bad settings or an output folder that must not be overwritten."""


@dataclass(frozen=True)
class DemoSettings:
    """Everything that determines the demo trajectory.

    Sizes: ``layers`` blocks of width ``hidden`` with ``heads`` heads and an MLP of ``4 * hidden``;
    ``vocab`` BPE tokens (>= 257: 256 bytes + end-of-text); ``seq_len`` tokens per training window,
    ``batch_size`` windows per update; AdamW with peak learning rate ``lr``, linear warm-up over
    ``warmup`` updates, cosine decay to 10 % of the peak.  ``threads``: torch CPU threads while training
    (1 by default: for a model this small one thread is nearly as fast as two and does not collapse when
    other processes share the cores; 0 = torch's default)."""

    steps: int = 1500
    seconds: float = 170.0
    checkpoints: int = 7
    seed: int = 0
    layers: int = 6
    hidden: int = 128
    heads: int = 4
    vocab: int = 1024
    seq_len: int = 128
    batch_size: int = 8
    lr: float = 2e-3
    warmup: int = 30
    heldout_words: int = 3000
    heldout_windows: int = 16
    threads: int = 1

    def validate(self) -> None:
        if self.steps < 1:
            raise DemoTrajectoryError(f"--steps must be at least 1, got {self.steps}")
        if not self.seconds > 0:
            raise DemoTrajectoryError(f"--seconds must be positive, got {self.seconds}")
        if self.checkpoints < 2:
            raise DemoTrajectoryError(f"--checkpoints must be at least 2 (step 0 and a final step), got {self.checkpoints}")
        if self.layers < 2:
            raise DemoTrajectoryError(f"--layers must be at least 2 (a trajectory needs layer pairs), got {self.layers}")
        if self.hidden % self.heads or (self.hidden // self.heads) % 4:
            raise DemoTrajectoryError(f"--hidden {self.hidden} must split into {self.heads} heads whose size is a "
                                      f"multiple of 4 (rotary on 25 % of each head)")
        if self.vocab < 257:
            raise DemoTrajectoryError(f"--vocab must be at least 257 (256 bytes + end-of-text), got {self.vocab}")
        if self.threads < 0:
            raise DemoTrajectoryError(f"--threads must be >= 0, got {self.threads}")
        if self.seq_len < 8 or self.batch_size < 1:
            raise DemoTrajectoryError("seq_len must be >= 8 and batch_size >= 1")


def checkpoint_steps(total: int, n: int, first: int = 2) -> list[int]:
    """Step 0 plus up to ``n - 1`` geometrically spaced steps from ``first`` to ``total`` (both included),
    rounded and de-duplicated: ``checkpoint_steps(2000, 7) == [0, 2, 8, 32, 126, 502, 2000]``."""
    total, first, k = int(total), max(1, int(first)), max(1, int(n) - 1)
    if total <= first:
        return [0, total] if total > 0 else [0]
    if k == 1:
        pts = [total]
    else:
        pts = [int(round(first * (total / first) ** (m / (k - 1)))) for m in range(k)]
    out = [0]
    for p in pts:
        if p > out[-1]:
            out.append(min(p, total))
    if out[-1] != total:
        out.append(total)
    return out


def default_out_dir() -> Path:
    return cache_root() / "demo-trajectory"


# ------------------------------------------------------------------------------------------ building blocks

def train_tokenizer(text: str, vocab: int):
    """A byte-level BPE of ``vocab`` tokens (id 0 = ``<|endoftext|>``, used as BOS/EOS, not added by default)
    trained on ``text``, wrapped as a transformers fast tokenizer (saves / loads with ``AutoTokenizer``)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=[SPECIAL], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([text], trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=SPECIAL, eos_token=SPECIAL,
                                   model_max_length=4096)


def model_config(s: DemoSettings, vocab_size: int):
    """GPT-NeoX config of the demo model (Pythia layout: parallel residual, rotary_pct 0.25)."""
    from transformers import GPTNeoXConfig

    return GPTNeoXConfig(vocab_size=vocab_size, hidden_size=s.hidden, num_hidden_layers=s.layers,
                         num_attention_heads=s.heads, intermediate_size=4 * s.hidden, rotary_pct=0.25,
                         max_position_embeddings=max(512, 2 * s.seq_len), use_parallel_residual=True,
                         bos_token_id=0, eos_token_id=0, tie_word_embeddings=False, hidden_dropout=0.0,
                         attention_dropout=0.0)


def init_model(s: DemoSettings, vocab_size: int):
    """The initialisation of the demo model: ``torch.manual_seed(s.seed)`` then ``from_config`` (float32).
    Step 0 of the trajectory is exactly this model."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(s.seed)
    return AutoModelForCausalLM.from_config(model_config(s, vocab_size), dtype=torch.float32)


def heldout_ids(tokenizer, s: DemoSettings, corpus=None):
    """Held-out evaluation windows [n, seq_len] from the corpus's evaluation region (never trained on)."""
    import torch

    corpus = corpus or builtin()
    text = corpus.eval_text(min(s.heldout_words, corpus.split_point))
    ids = torch.tensor(tokenizer(text, verbose=False)["input_ids"], dtype=torch.long)
    n = min(s.heldout_windows, len(ids) // s.seq_len)
    if n < 1:
        raise DemoTrajectoryError("held-out text is shorter than one window")
    return ids[: n * s.seq_len].view(n, s.seq_len)


def heldout_loss(model, windows) -> float:
    """Mean next-token negative log-likelihood (nats/token) of ``model`` on ``windows`` [n, T]."""
    import torch

    was_training = model.training
    model.eval()
    with torch.no_grad():
        out = model(input_ids=windows, labels=windows, use_cache=False)
    model.train(was_training)
    return float(out.loss)


def _lr_at(step: int, planned: int, s: DemoSettings) -> float:
    """Learning rate for update number ``step`` (1-based): warm-up then cosine to 10 %."""
    if step <= s.warmup:
        return s.lr * step / s.warmup
    frac = min(1.0, (step - s.warmup) / max(1, planned - s.warmup))
    return s.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


# ------------------------------------------------------------------------------------------ the run

def read_manifest(out: str | os.PathLike) -> dict | None:
    p = Path(out) / MANIFEST
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("format") == FORMAT else None


def _complete(out: Path, manifest: dict | None) -> bool:
    return bool(manifest) and all((out / c["folder"] / "config.json").is_file() for c in manifest["checkpoints"])


def train_demo_trajectory(out: str | os.PathLike | None = None, settings: DemoSettings | None = None,
                          force: bool = False, progress: Callable[[int, int, str], None] | None = None,
                          should_stop: Callable[[], bool] | None = None, **overrides) -> Path:
    """Train the demo model and write its checkpoints and ``trajectory.json`` into ``out``; returns ``out``.

    ``settings`` (or keyword overrides of :class:`DemoSettings`: ``steps``, ``seconds``, ``checkpoints``,
    ``seed``, sizes) say what to train.  A finished trajectory with the same settings in ``out`` is reused
    unless ``force``.  ``out`` is written as a whole: a temporary folder beside it is filled, then moved into
    place; an existing ``out`` that is not a demo trajectory is never overwritten.
    ``progress(step, planned_steps, message)`` is called as training proceeds; ``should_stop()`` is polled
    before every update and, when true, abandons the run (:class:`~swapkl.errors.ComputeInterrupted`; ``out``
    is left as it was)."""
    import torch

    s = settings or DemoSettings()
    if overrides:
        s = DemoSettings(**{**asdict(s), **overrides})
    s.validate()
    out = Path(out).expanduser() if out is not None else default_out_dir()
    say = progress or (lambda d, t, m: None)
    t_start = time.perf_counter()
    corpus = builtin()
    existing = read_manifest(out)
    if out.exists() and any(out.iterdir()) and existing is None:
        raise DemoTrajectoryError(f"{out} exists and is not a demo trajectory; choose another --out")
    if existing and not force and existing.get("settings") == asdict(s) and \
            existing.get("corpus", {}).get("sha256") == corpus.sha256 and _complete(out, existing):
        say(existing["final_step"], existing["final_step"], f"reusing {out}")
        return out

    threads_before = torch.get_num_threads()
    try:
        with temp_folder(out.parent, f".{out.name}.") as tmp:
            if s.threads:
                torch.set_num_threads(s.threads)
            manifest = _train_into(tmp, s, corpus, t_start, say, should_stop)
            manifest["seconds_total"] = round(time.perf_counter() - t_start, 2)
            (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1), encoding="utf-8")
            atomic_replace_dir(tmp, out)
    finally:
        torch.set_num_threads(threads_before)
    return out


def _train_into(folder: Path, s: DemoSettings, corpus, t_start: float, say, should_stop=None) -> dict:
    return _Trainer(folder, s, corpus, t_start, say).run(should_stop)


class _Trainer:
    """One demo training run into ``folder``: tokenizer, model and optimiser (``__init__``), the training steps with
    the step count planned to fit the time budget, a checkpoint at each scheduled step, and the manifest."""

    def __init__(self, folder: Path, s: DemoSettings, corpus, t_start: float, say):
        import torch

        self.folder, self.s, self.corpus, self.t_start, self.say = folder, s, corpus, t_start, say
        train_text = corpus.prompt_text()
        self.tokenizer = train_tokenizer(train_text, s.vocab)
        self.vocab_size = len(self.tokenizer)
        self.data = torch.tensor(self.tokenizer(train_text, verbose=False)["input_ids"], dtype=torch.long)
        say(0, s.steps, f"tokenizer trained ({self.vocab_size} tokens); {len(self.data)} training tokens "
            f"({time.perf_counter() - t_start:.1f} s)")
        if len(self.data) < s.seq_len + 2:
            raise DemoTrajectoryError("training text is shorter than one window")
        self.heldout = heldout_ids(self.tokenizer, s, corpus)
        self.model = init_model(s, self.vocab_size)
        self.model.train()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=s.lr, betas=(0.9, 0.95), weight_decay=0.01)
        self.gen = torch.Generator().manual_seed(s.seed + 1)
        self.records: list[dict] = []
        self.train_losses: list[float] = []
        self.step_times: list[float] = []

    def save(self, step: int) -> float:
        """Write checkpoint ``step`` (model, tokenizer, held-out loss); returns the seconds it took."""
        t0 = time.perf_counter()
        name = f"step{step}"
        loss = heldout_loss(self.model, self.heldout)
        self.model.save_pretrained(self.folder / name, safe_serialization=True)
        self.tokenizer.save_pretrained(self.folder / name)
        recent = self.train_losses[-20:]
        self.records.append({"step": step, "folder": name, "heldout_loss": loss,
                             "train_loss": sum(recent) / len(recent) if recent else None,
                             "elapsed_s": round(time.perf_counter() - self.t_start, 2)})
        return time.perf_counter() - t0

    def train_step(self, step: int, planned: int) -> None:
        import torch

        s, model, opt = self.s, self.model, self.opt
        t0 = time.perf_counter()
        for group in opt.param_groups:
            group["lr"] = _lr_at(step, planned, s)
        starts = torch.randint(0, len(self.data) - s.seq_len, (s.batch_size,), generator=self.gen)
        batch = torch.stack([self.data[i: i + s.seq_len] for i in starts.tolist()])
        loss = model(input_ids=batch, labels=batch, use_cache=False).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        self.train_losses.append(loss.item())
        self.step_times.append(time.perf_counter() - t0)

    def planned_steps(self, save_cost: float) -> int:
        """The step count that fits the whole schedule into the time budget (upper bound: ``s.steps``), from the
        time of the last step."""
        s, per_step = self.s, self.step_times[-1]
        left = s.seconds - (time.perf_counter() - self.t_start) - (s.checkpoints + 1) * save_cost - 1.0
        fit = int(PLAN_MARGIN * left / per_step) if per_step > 0 else s.steps
        return max(2, min(s.steps, fit))

    def run(self, should_stop=None) -> dict:
        s, say = self.s, self.say
        save_cost = self.save(0)
        say(0, s.steps, f"step 0 saved (held-out loss {self.records[-1]['heldout_loss']:.3f} nats/token)")
        planned = s.steps
        schedule = set(checkpoint_steps(planned, s.checkpoints))
        last_saved, stopped_early, step = 0, False, 0
        while step < planned:
            if should_stop is not None and should_stop():
                raise ComputeInterrupted(f"demo training stopped at step {step}; nothing was written")
            step += 1
            self.train_step(step, planned)
            if step == 2 and planned > 2:
                planned = self.planned_steps(save_cost)
                schedule = set(checkpoint_steps(planned, s.checkpoints))
            if step in schedule or step == planned:
                self.save(step)
                last_saved = step
                say(step, planned, f"step {step} saved (held-out loss {self.records[-1]['heldout_loss']:.3f})")
            elif step % 25 == 0:
                say(step, planned, f"train loss {self.train_losses[-1]:.3f}")
            avg_step = sum(self.step_times[-20:]) / len(self.step_times[-20:])
            if step < planned and time.perf_counter() - self.t_start + save_cost + avg_step > s.seconds:
                stopped_early = True
                if last_saved != step:
                    self.save(step)
                say(step, step, f"time limit reached; step {step} saved as the final checkpoint")
                break
        return self.manifest(planned, step, stopped_early)

    def manifest(self, planned: int, step: int, stopped_early: bool) -> dict:
        import torch

        s, corpus, step_times = self.s, self.corpus, self.step_times
        return {
            "format": FORMAT,
            "description": "small GPT-NeoX (Pythia layout) trained on the CPU by swapkl demo-trajectory",
            "settings": asdict(s),
            "model_type": "gpt_neox",
            "num_layers": s.layers,
            "vocab_size": self.vocab_size,
            "parameters": int(sum(p.numel() for p in self.model.parameters())),
            "corpus": {"name": corpus.name, "label": corpus.label, "sha256": corpus.sha256,
                       "training_text": "prompt region", "heldout_text": f"first {s.heldout_words} words of the "
                       f"evaluation region, {self.heldout.shape[0]} windows of {s.seq_len} tokens"},
            "planned_steps": planned,
            "final_step": step,
            "stopped_early": stopped_early,
            "seconds_per_step": sum(step_times) / len(step_times) if step_times else None,
            "torch_threads": torch.get_num_threads(),
            "steps": [r["step"] for r in self.records],
            "checkpoints": self.records,
        }
