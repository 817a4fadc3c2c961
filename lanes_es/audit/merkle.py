"""The Merkle tree of a batch's log, as RFC 6962 / RFC 9162 define it (pure).

Leaves are the events in order: leaf hash = sha256(0x00 || event bytes), node hash =
sha256(0x01 || left || right), the tree split at the largest power of two below its size.
Inclusion proofs (PATH) and consistency proofs (PROOF) are the RFC's, so a proof made
here verifies with any transparency-log verifier and the reverse; the tests check both
against the Certificate Transparency vectors (transparency-dev/merkle).

Written here rather than taken from `pymerkle`: pymerkle 7 computes the same roots, but
its proofs are its own format (the leaf inside the path, rule and subset bits, four
hashes where the RFC's consistency proof has three), so they do not interoperate.
"""

from __future__ import annotations

import hashlib
from typing import Sequence

EMPTY_ROOT = hashlib.sha256(b"").digest()


def leaf_hash(data: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def root_of(leaves: Sequence[bytes]) -> bytes:
    """MTH of leaf hashes. Pairing level by level and lifting an odd last node unchanged
    builds the same tree as the RFC's split at the largest power of two, in linear time."""
    if not leaves:
        return EMPTY_ROOT
    level = list(leaves)
    while len(level) > 1:
        paired = [node_hash(level[index], level[index + 1]) for index in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            paired.append(level[-1])
        level = paired
    return level[0]


def _split(size: int) -> int:
    """The largest power of two smaller than `size` (size >= 2)."""
    return 1 << ((size - 1).bit_length() - 1)


def inclusion_proof(index: int, leaves: Sequence[bytes]) -> list[bytes]:
    """PATH(index, leaves): the sibling hashes from the leaf up, RFC 9162 §2.1.3.1."""
    if not 0 <= index < len(leaves):
        raise ValueError(f"leaf {index} is not in a tree of size {len(leaves)}")
    if len(leaves) == 1:
        return []
    k = _split(len(leaves))
    if index < k:
        return inclusion_proof(index, leaves[:k]) + [root_of(leaves[k:])]
    return inclusion_proof(index - k, leaves[k:]) + [root_of(leaves[:k])]


def consistency_proof(old_size: int, leaves: Sequence[bytes]) -> list[bytes]:
    """PROOF(old_size, leaves), RFC 9162 §2.1.4.1; empty when old_size is 0 or the whole tree."""
    if not 0 <= old_size <= len(leaves):
        raise ValueError(f"size {old_size} is not a prefix of a tree of size {len(leaves)}")
    if old_size in (0, len(leaves)):
        return []
    return _subproof(old_size, leaves, True)


def _subproof(size: int, leaves: Sequence[bytes], whole: bool) -> list[bytes]:
    if size == len(leaves):
        return [] if whole else [root_of(leaves)]
    k = _split(len(leaves))
    if size <= k:
        return _subproof(size, leaves[:k], whole) + [root_of(leaves[k:])]
    return _subproof(size - k, leaves[k:], False) + [root_of(leaves[:k])]


def root_from_inclusion(index: int, size: int, leaf: bytes, proof: Sequence[bytes]) -> bytes | None:
    """The root an inclusion proof leads to (RFC 9162 §2.1.3.2), None when the proof cannot fit the sizes."""
    if not 0 <= index < size or any(len(item) != 32 for item in proof) or len(leaf) != 32:
        return None
    fn, sn, result = index, size - 1, leaf
    for sibling in proof:
        if sn == 0:
            return None
        if fn & 1 or fn == sn:
            result = node_hash(sibling, result)
            while not fn & 1 and fn != 0:
                fn, sn = fn >> 1, sn >> 1
        else:
            result = node_hash(result, sibling)
        fn, sn = fn >> 1, sn >> 1
    return result if sn == 0 else None


def verify_inclusion(index: int, size: int, leaf: bytes, proof: Sequence[bytes], root: bytes) -> bool:
    return root_from_inclusion(index, size, leaf, proof) == root


def verify_consistency(old_size: int, new_size: int, old_root: bytes, new_root: bytes,
                       proof: Sequence[bytes]) -> bool:
    """RFC 9162 §2.1.4.2, with the trivial cases as transparency-dev/merkle takes them."""
    if old_size < 0 or new_size < old_size or any(len(item) != 32 for item in proof):
        return False
    if old_size == new_size:
        return not proof and old_root == new_root
    if old_size == 0:
        return not proof
    if not proof:
        return False
    path = list(proof)
    if old_size & (old_size - 1) == 0:  # an exact power of two: the old root is the first node
        path.insert(0, old_root)
    fn, sn = old_size - 1, new_size - 1
    while fn & 1:
        fn, sn = fn >> 1, sn >> 1
    first = second = path[0]
    for node in path[1:]:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            first, second = node_hash(node, first), node_hash(node, second)
            while not fn & 1 and fn != 0:
                fn, sn = fn >> 1, sn >> 1
        else:
            second = node_hash(second, node)
        fn, sn = fn >> 1, sn >> 1
    return sn == 0 and first == old_root and second == new_root
