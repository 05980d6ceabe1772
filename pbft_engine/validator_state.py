"""`DIR/validator_state.json`: the validator's signing bound, beside its database.

The file outlives `chaindata` (rebuilding a validator or recovering a damaged database removes
that directory and keeps this file), as CometBFT's `priv_validator_state.json` outlives its
`data/`. `pbft_engine.core.signing_bound` says what it holds and why. It is replaced
atomically (a synced temporary file renamed over it, then the directory synced), after the
consensus records and before the messages of the step that raised the bound.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from pbft_engine.core.signing_bound import SigningBound
from pbft_engine.errors import StoreError

FILE_NAME = "validator_state.json"


class ValidatorStateFile:
    def __init__(self, datadir: Path, address: bytes) -> None:
        self.path = Path(datadir) / FILE_NAME
        self.address = "0x" + address.hex()

    def read(self) -> SigningBound | None:
        """The bound written last; None if there is no file (a new validator, or lost)."""
        try:
            document = json.loads(self.path.read_text())
            bound = SigningBound(int(document["view"]), int(document["seqNo"]))
            address = str(document["address"]).lower()
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise StoreError(f"cannot read {self.path}: {exc}; restore it from a backup (it "
                             "says what this validator signed)") from None
        if address != self.address:
            raise StoreError(f"{self.path} belongs to validator {address}, not to this one "
                             f"({self.address})")
        if bound.view < 0 or bound.seq_no < 0:
            raise StoreError(f"{self.path} is damaged: a negative view or seqNo")
        return bound

    def write(self, bound: SigningBound) -> None:
        document = {"address": self.address, "view": bound.view, "seqNo": bound.seq_no}
        temporary = self.path.with_name(FILE_NAME + ".tmp")
        try:
            with open(temporary, "w") as out:
                json.dump(document, out)
                out.flush()
                os.fsync(out.fileno())
            os.replace(temporary, self.path)
            directory = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)
        except OSError as exc:
            raise StoreError(f"cannot write {self.path}: {exc.strerror or exc}") from None
