"""The healing recipe: every setting that determines the trained LoRA weights, validated, recorded and hashed."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from swapkl.contract import stable_hash
from swapkl.errors import ContractError

#: bound on anything a user asks for (the dashboard's demo mode bounds it further, jobs/policy.py)
MAX_STEPS = 100_000
MAX_RANK = 1024
SCHEDULES = ("constant", "cosine")


@dataclass(frozen=True)
class Recipe:
    """A LoRA fine-tune.

    * ``steps`` optimizer updates of ``batch`` sequences of ``seq_len`` tokens (no gradient accumulation);
    * LoRA of rank ``rank``, ``alpha`` (scale alpha/rank), ``dropout`` on every linear layer of the kept blocks;
    * AdamW (``lr``, ``weight_decay``, betas 0.9/0.999), linear warm-up over ``warmup`` steps, then ``schedule``;
    * ``seed``: LoRA initialisation, batch order and dropout;
    * ``checkpoint_every``: a resumable checkpoint every k steps (not part of the key: it does not change the
      weights);
    * ``qlora``: 4-bit base weights through bitsandbytes (CUDA only).
    """

    steps: int = 200
    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    lr: float = 1e-3
    weight_decay: float = 0.0
    warmup: int = 10
    schedule: str = "constant"
    seq_len: int = 128
    batch: int = 4
    seed: int = 0
    qlora: bool = False
    checkpoint_every: int = field(default=50, compare=False)

    def validate(self) -> Recipe:
        """Raise :class:`ContractError` (one line) for an impossible setting; return self."""
        def need(ok, msg):
            if not ok:
                raise ContractError(msg)

        need(isinstance(self.steps, int) and 0 <= self.steps <= MAX_STEPS, f"--steps must be 0..{MAX_STEPS} "
             f"(got {self.steps})")
        need(isinstance(self.rank, int) and 1 <= self.rank <= MAX_RANK, f"--lora-rank must be 1..{MAX_RANK} "
             f"(got {self.rank})")
        need(self.alpha > 0, f"LoRA alpha must be positive (got {self.alpha})")
        need(0.0 <= self.dropout < 1.0, f"LoRA dropout must be in [0, 1) (got {self.dropout})")
        need(0.0 < self.lr <= 1.0, f"--lr must be in (0, 1] (got {self.lr})")
        need(self.weight_decay >= 0, f"weight decay must be >= 0 (got {self.weight_decay})")
        need(isinstance(self.warmup, int) and self.warmup >= 0, f"warm-up steps must be >= 0 (got {self.warmup})")
        need(self.schedule in SCHEDULES, f"schedule must be one of {', '.join(SCHEDULES)} (got {self.schedule})")
        need(isinstance(self.seq_len, int) and 8 <= self.seq_len <= 8192, f"--seq-len must be 8..8192 "
             f"(got {self.seq_len})")
        need(isinstance(self.batch, int) and 1 <= self.batch <= 1024, f"--batch must be 1..1024 (got {self.batch})")
        need(isinstance(self.seed, int) and self.seed >= 0, f"--seed must be a non-negative integer (got {self.seed})")
        need(isinstance(self.checkpoint_every, int) and self.checkpoint_every >= 1,
             f"checkpoint interval must be >= 1 step (got {self.checkpoint_every})")
        return self

    @property
    def tokens_seen(self) -> int:
        """Training tokens fed (inputs), ``steps × batch × seq_len``."""
        return self.steps * self.batch * self.seq_len

    def lr_at(self, step: int) -> float:
        """Learning rate of update ``step`` (0-based): linear warm-up, then constant or cosine to 10 %."""
        import math

        if self.warmup and step < self.warmup:
            return self.lr * (step + 1) / self.warmup
        if self.schedule == "cosine" and self.steps > self.warmup:
            t = (step - self.warmup) / max(1, self.steps - self.warmup)
            return self.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))
        return self.lr

    def to_dict(self) -> dict:
        d = asdict(self)
        d["tokens_seen"] = self.tokens_seen
        d["optimizer"] = "AdamW(0.9, 0.999, eps 1e-8)"
        d["target"] = "every linear layer of the kept blocks"
        return d

    def key(self) -> str:
        """Hash of the settings that determine the weights (``checkpoint_every`` excluded)."""
        d = asdict(self)
        d.pop("checkpoint_every")
        return stable_hash(d)[:20]

    def describe(self) -> str:
        """One line for captions: ``LoRA r8 α16, 200 steps × 4 × 128 tok, lr 1e-3, seed 0``."""
        q = "QLoRA" if self.qlora else "LoRA"
        return (f"{q} r{self.rank} α{self.alpha:g}, {self.steps} steps × {self.batch} × {self.seq_len} tok, "
                f"lr {self.lr:g}, seed {self.seed}")

    @classmethod
    def from_dict(cls, d: dict) -> Recipe:
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in d.items() if k in names}).validate()
