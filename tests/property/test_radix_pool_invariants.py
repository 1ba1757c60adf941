"""SGLang's radix pool under random admissions, prefills, decodes and releases: its counters
always agree with the tree, every running request's pages are a locked path from the root, an
allocation fails only when the free pages fall short, and pages are never lost."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from servesim.kv.radix_pool import Node, RadixPool
from servesim.workload.request import Request


def chain(tokens: tuple[int, ...]) -> list[int]:
    """Page keys of a sequence (a page per token): each names its whole prefix."""
    return [hash(tokens[: i + 1]) for i in range(len(tokens))]


def nodes(pool: RadixPool) -> list[Node]:
    out, stack = [], list(pool.root.children.values())
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(node.children.values())
    return out


def check(pool: RadixPool, live: list[Request]) -> None:
    tree = nodes(pool)
    assert pool.n_resident == sum(len(n.keys) for n in tree)
    assert pool.n_inactive == sum(len(n.keys) for n in tree if not n.locks)
    assert pool.n_private == sum(r.held_private_blocks for r in live)
    assert all(n.keys for n in tree), "an empty edge stayed in the tree"
    assert pool.n_empty >= 0 and pool.free_blocks <= pool.capacity_blocks
    for r in live:
        n, n_locked = pool.match(r.held_hashes)
        assert n == n_locked == len(r.held_hashes), "a running request's path is not locked"
    assert set(pool.lock_of) == {r for r in live if r in pool.lock_of}


# an operation: (kind, request slot, prompt) with prompts over a 2-letter alphabet, so that
# they share prefixes and part ways
ops = st.lists(
    st.tuples(
        st.sampled_from(["admit", "decode", "release"]),
        st.integers(0, 3),
        st.lists(st.integers(0, 1), min_size=1, max_size=6).map(tuple),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(capacity=st.integers(4, 16), steps=ops)
def test_the_counters_follow_the_tree(capacity: int, steps: list) -> None:
    pool = RadixPool(capacity)
    slots: dict[int, tuple[Request, tuple[int, ...]]] = {}
    serial = 0
    for kind, slot, prompt in steps:
        if kind == "admit" and slot not in slots:
            serial += 1
            r = Request(0, str(serial), len(prompt), 4, [])
            keys = chain(prompt)
            hit = min(pool.match(keys)[0], len(keys) - 1)
            free_before = pool.free_blocks - (hit - pool.match(keys[:hit])[1])
            if hit:
                pool.acquire(r, keys[:hit])
            if pool.allocate(r, len(keys) - hit):
                pool.register_many(r, keys[hit:])
                slots[slot] = (r, prompt)
            else:
                assert len(keys) - hit > free_before
                pool.release(r)
        elif kind == "decode" and slot in slots:
            r, seq = slots[slot]
            seq = (*seq, 2 + int(r.request_id))  # a token only this request has
            if pool.allocate(r, 1):
                pool.register_many(r, chain(seq)[-1:])
                slots[slot] = (r, seq)
        elif kind == "release" and slot in slots:
            pool.release(slots.pop(slot)[0])
        check(pool, [r for r, _ in slots.values()])
    for r, _ in slots.values():
        pool.release(r)
    check(pool, [])
    assert pool.free_blocks == capacity, "pages were lost"
