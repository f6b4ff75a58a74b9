"""A torchrun entry point for tests/scoring/test_distributed.py: ``swapkl.commands.distributed`` with, per rank, its own
cache folder (``$SWAPKL_TEST_CACHES/rank<RANK>``, when set: nothing shared between ranks) and, on the rank named by
``$SWAPKL_TEST_OTHER_TOKENIZER``, prompts cut as another tokenizer would (the token stream shifted by one)."""
import os
import sys

rank = os.environ.get("RANK", "0")
if os.environ.get("SWAPKL_TEST_CACHES"):
    os.environ["SWAPKL_CACHE"] = os.path.join(os.environ["SWAPKL_TEST_CACHES"], f"rank{rank}")
if os.environ.get("SWAPKL_TEST_OTHER_TOKENIZER") == rank:
    import swapkl.scoring.prompts as prompts

    real = prompts.tokenize_stream
    prompts.tokenize_stream = lambda tokenizer, text: real(tokenizer, text)[1:]

from swapkl.commands.distributed import main  # noqa: E402  (after the environment it reads)

sys.exit(main())
