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


class Tree:
    """The tree over `leaves` (leaf hashes) with every subtree root it computes kept, so that many proofs
    over one log (verify checks each checkpoint of a ref against the newest) hash each subtree once."""

    def __init__(self, leaves: Sequence[bytes]) -> None:
        self.leaves = leaves
        self._roots: dict[tuple[int, int], bytes] = {}

    def root(self, start: int = 0, end: int | None = None) -> bytes:
        """MTH(leaves[start:end])."""
        end = len(self.leaves) if end is None else end
        if end - start <= 1:
            return self.leaves[start] if end > start else EMPTY_ROOT
        found = self._roots.get((start, end))
        if found is None:
            middle = start + _split(end - start)
            found = self._roots[(start, end)] = node_hash(self.root(start, middle), self.root(middle, end))
        return found

    def inclusion_proof(self, index: int, size: int | None = None) -> list[bytes]:
        """PATH(index, leaves[:size]): the sibling hashes from the leaf up, RFC 9162 §2.1.3.1."""
        size = len(self.leaves) if size is None else size
        if not 0 <= index < size <= len(self.leaves):
            raise ValueError(f"leaf {index} is not in a tree of size {size}")
        return self._path(index, 0, size)

    def _path(self, index: int, start: int, end: int) -> list[bytes]:
        if end - start == 1:
            return []
        middle = start + _split(end - start)
        if index < middle:
            return self._path(index, start, middle) + [self.root(middle, end)]
        return self._path(index, middle, end) + [self.root(start, middle)]

    def consistency_proof(self, old_size: int, size: int | None = None) -> list[bytes]:
        """PROOF(old_size, leaves[:size]), RFC 9162 §2.1.4.1; empty when old_size is 0 or the whole tree."""
        size = len(self.leaves) if size is None else size
        if not 0 <= old_size <= size <= len(self.leaves):
            raise ValueError(f"size {old_size} is not a prefix of a tree of size {size}")
        if old_size in (0, size):
            return []
        return self._subproof(old_size, 0, size, True)

    def _subproof(self, old_end: int, start: int, end: int, whole: bool) -> list[bytes]:
        if old_end == end:
            return [] if whole else [self.root(start, end)]
        middle = start + _split(end - start)
        if old_end <= middle:
            return self._subproof(old_end, start, middle, whole) + [self.root(middle, end)]
        return self._subproof(old_end, middle, end, False) + [self.root(start, middle)]


def inclusion_proof(index: int, leaves: Sequence[bytes]) -> list[bytes]:
    """PATH(index, leaves): the sibling hashes from the leaf up, RFC 9162 §2.1.3.1."""
    return Tree(leaves).inclusion_proof(index)


def consistency_proof(old_size: int, leaves: Sequence[bytes]) -> list[bytes]:
    """PROOF(old_size, leaves), RFC 9162 §2.1.4.1; empty when old_size is 0 or the whole tree."""
    return Tree(leaves).consistency_proof(old_size)


class CompactRange:
    """The right edge of the tree over the first `size` leaves: the roots of its perfect subtrees, largest
    first (one per set bit of `size`). Enough to append leaves and to give the root, so a checkpoint
    hashes only the events appended since the last one: O(new events + log size) per append."""

    def __init__(self, size: int = 0, hashes: Sequence[bytes] = ()) -> None:
        if len(hashes) != bin(size).count("1"):
            raise ValueError(f"a compact range of {size} leaves has {bin(size).count('1')} hashes, not {len(hashes)}")
        self.size = size
        self.hashes = list(hashes)

    @classmethod
    def of(cls, leaves: Sequence[bytes]) -> "CompactRange":
        edge = cls()
        for leaf in leaves:
            edge.append(leaf)
        return edge

    def append(self, leaf: bytes) -> None:
        merged, size = leaf, self.size
        while size & 1:  # a full subtree of the same height on the left: they pair up, as a binary carry
            merged = node_hash(self.hashes.pop(), merged)
            size >>= 1
        self.hashes.append(merged)
        self.size += 1

    def root(self) -> bytes:
        """MTH of the leaves so far: the perfect subtrees folded from the right (RFC 6962's split)."""
        if not self.hashes:
            return EMPTY_ROOT
        result = self.hashes[-1]
        for subtree in reversed(self.hashes[:-1]):
            result = node_hash(subtree, result)
        return result


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
