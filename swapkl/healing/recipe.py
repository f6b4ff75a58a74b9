"""The healing recipe: every setting that determines the trained LoRA weights, validated, recorded and hashed."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from swapkl.contract import stable_hash
from swapkl.errors import ContractError

#: bound on anything a user asks for (the dashboard's demo mode bounds it further, jobs/policy.py)
MAX_STEPS = 100_000
MAX_RANK = 1024
SCHEDULES = ("constant", "cosine")
#: what the loss is: the language-modelling loss, the forward KL from the unpruned teacher, or their mix
OBJECTIVES = ("lm", "kd", "kd+lm")
#: what is trained: LoRA on every linear layer of the kept blocks, the last k kept blocks and lm_head in full, or
#: LoRA together with the bridge matrices of a ``--repair bridge`` heal (one d×d W per removed span)
PARTS = ("lora", "last-k", "bridge")
#: the settings each objective / part does not read: left out of the key, so the key of an ``lm`` LoRA heal holds
#: no KD or last-k setting, and a ``kd`` heal never shares an ``lm`` heal's folder
_UNUSED = {"lm": ("temperature", "kd_weight", "top_k"), "kd": ("kd_weight",), "kd+lm": (),
           "lora": ("last_k",), "last-k": ("rank", "alpha", "dropout", "qlora"), "bridge": ("last_k",)}


@dataclass(frozen=True)
class Recipe:
    """A healing fine-tune (docs/healing.md).

    * ``steps`` optimizer updates of ``batch`` sequences of ``seq_len`` tokens (no gradient accumulation);
    * LoRA of rank ``rank``, ``alpha`` (scale alpha/rank), ``dropout`` on every linear layer of the kept blocks;
    * AdamW (``lr``, ``weight_decay``, betas 0.9/0.999), linear warm-up over ``warmup`` steps, then ``schedule``;
    * ``seed``: LoRA initialisation, batch order and dropout;
    * ``checkpoint_every``: a resumable checkpoint every k steps (not part of the key: it does not change the
      weights);
    * ``qlora``: 4-bit base weights through bitsandbytes (CUDA only);
    * ``objective`` (:data:`OBJECTIVES`): ``lm`` (next-token cross-entropy), ``kd`` (forward KL from the unpruned
      model to the student at every position, both at ``temperature`` T, times T²; the teacher as top-``top_k``
      log-probabilities + the tail mass, :mod:`swapkl.healing.teacher`), ``kd+lm``: ``kd_weight`` × KD +
      (1 − ``kd_weight``) × LM;
    * ``part`` (:data:`PARTS`): ``lora``, or ``last-k``: the last ``last_k`` kept blocks and lm_head in full, or
      ``bridge``: LoRA and the bridge matrices W of a ``--repair bridge`` heal, trained from their least-squares fit
      (:mod:`swapkl.healing.bridged`; the heal refuses it without the repair).
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
    objective: str = "lm"
    temperature: float = 1.0
    kd_weight: float = 0.5
    top_k: int = 64
    part: str = "lora"
    last_k: int = 3

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
        need(self.objective in OBJECTIVES, f"--objective must be one of {', '.join(OBJECTIVES)} (got {self.objective})")
        need(0.0 < self.temperature <= 100.0, f"--temperature must be in (0, 100] (got {self.temperature})")
        need(0.0 <= self.kd_weight <= 1.0, f"--kd-weight must be in [0, 1] (got {self.kd_weight})")
        need(isinstance(self.top_k, int) and 1 <= self.top_k <= 1_000_000, f"--top-k must be 1..1000000 "
             f"(got {self.top_k})")
        need(self.part in PARTS, f"--train must be one of {', '.join(PARTS)} (got {self.part})")
        need(isinstance(self.last_k, int) and 1 <= self.last_k <= 1024, f"--k must be 1..1024 (got {self.last_k})")
        need(not (self.qlora and self.part != "lora"), "--qlora trains LoRA on 4-bit weights; it needs --train lora")
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
        d["target"] = {"lora": "every linear layer of the kept blocks",
                       "last-k": f"the last {self.last_k} kept blocks and lm_head, in full",
                       "bridge": "every linear layer of the kept blocks and the bridge matrices W (one d×d per "
                                 "removed span, from their least-squares fit)"}[self.part]
        return d

    def for_set(self, removed) -> Recipe:
        """The recipe that trains the removal set ``removed``: this one, except for the control (no set), which has
        no bridge, so ``--train bridge``'s control is trained with the LoRA recipe (same weights, shared adapter)."""
        return self if list(removed) or self.part != "bridge" else replace(self, part="lora")

    def key(self) -> str:
        """Hash of the settings that determine the weights: ``checkpoint_every`` and the settings the objective and
        the trained part do not read are left out (:data:`_UNUSED`), as are ``objective`` ``lm`` and ``part``
        ``lora``, the defaults, so an LM LoRA heal keeps its key."""
        d = asdict(self)
        for k in ("checkpoint_every", *_UNUSED[self.objective], *_UNUSED[self.part]):
            d.pop(k)
        if self.objective == "lm":
            d.pop("objective")
        if self.part == "lora":
            d.pop("part")
        return stable_hash(d)[:20]

    @property
    def distills(self) -> bool:
        """True when the loss has a KD term (a teacher is needed)."""
        return self.objective != "lm"

    def describe(self) -> str:
        """One line for captions: ``LoRA r8 α16, 200 steps × 4 × 128 tok, lr 1e-3, seed 0`` (then the objective
        when it is not ``lm``: ``, KD T 2 top-64`` or ``, KD 0.5 + LM 0.5 T 2 top-64``)."""
        q = "QLoRA" if self.qlora else "LoRA"
        what = f"last {self.last_k} blocks + lm_head" if self.part == "last-k" else f"{q} r{self.rank} α{self.alpha:g}"
        what += " + bridge W" if self.part == "bridge" else ""
        line = (f"{what}, {self.steps} steps × {self.batch} × {self.seq_len} tok, lr {self.lr:g}, seed {self.seed}")
        kd = f"T {self.temperature:g} top-{self.top_k}"
        if self.objective == "kd":
            line += f", KD {kd}"
        elif self.objective == "kd+lm":
            line += f", KD {self.kd_weight:g} + LM {1 - self.kd_weight:g} {kd}"
        return line

    @classmethod
    def from_dict(cls, d: dict) -> Recipe:
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in d.items() if k in names}).validate()


def training_key(text_key: str, bridge_key: str | None = None) -> str:
    """The key a heal's training run (its cache folder and in-session adapter) is filed under: the training text's
    key, plus the bridge's key when the set was healed from its bridged model."""
    return text_key + (f":bridge:{bridge_key}" if bridge_key is not None else "")
