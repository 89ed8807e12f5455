#!/usr/bin/env python3
"""Randomized model check of the exactly-once-output protocol for lambda-streams.

Pure Python, seeded.  Simulates:
  * Kafka: partition logs, transactional producers (InitProducerId epoch bump that
    aborts an Ongoing txn, CONCURRENT_TRANSACTIONS while a txn is Prepare*),
    EndTxn that returns after PrepareCommit with markers written asynchronously,
    transactional offsets materialized asynchronously after their marker,
    coordinator timeout aborts (with epoch bump), transactional offset commits
    (TxnOffsetCommit, generation -1, pending until the marker), OffsetFetch with
    or without require_stable, read_committed / read_uncommitted reads (LSO).
  * Lambda Kafka ESM: per-stage consumer group offsets, batches over random
    subsets of free partitions with random end offsets, retry after failure,
    timeouts that free the partitions while the timed-out invocation keeps
    running (zombie), crashes at every step, warm execution environments that
    cache producers.  The stage-2 ESM reads the repartition topic
    read_uncommitted (worst case: its isolation level is undocumented).
  * DynamoDB: per-key items with per-source-partition watermarks, conditional
    (atomic) updates, and an outbox of (offset -> version, value) per source
    partition, pruned below the shadow offset.

Topology: stage 1 reads S (2-3 partitions); per record emits a stateless record to
OUT, an aggregate update (key, version, sum) to AGG, a repartition record to REP
(2 partitions, by rkey).  Stage 2 reads REP via its own ESM, aggregates per rkey,
emits a stateless record to OUT2 and an aggregate update to AGG2.

Protocol (per invocation, per source partition tp of the batch):
  1. producer for transactional.id "<stage>-<tp>": reuse the warm environment's
     producer, else init_transactions() (fences, completes the previous txn);
  2. s = OffsetFetch(shadow group, tp, require_stable)      [after 1]
  3. stage 2 only: re-read [first,last] of tp with read_committed (wait for LSO);
  4. per record o: DynamoDB conditional update (or outbox lookup if already
     applied); if o >= s produce its outputs into tp's transaction;
  5. sendOffsetsToTransaction(shadow group, tp -> max(s, last+1)); commit.
"""
import argparse
import random
import sys
import time
from collections import defaultdict

BLOCKED = object()


class Fenced(Exception):
    pass


class Missing(Exception):
    pass


# ----------------------------------------------------------------------------- Kafka
class Kafka:
    def __init__(self, world):
        self.w = world
        self.logs = defaultdict(list)          # tp -> [(value, txn_key)]
        self.txn = {}                          # txn_key -> 'open'|'commit'|'abort'
        self.tids = {}                         # tid -> dict
        self.offsets = {}                      # (group, tp) -> offset
        self.pending = defaultdict(dict)       # (group, tp) -> {txn_key: offset}
        self.markers = []                      # [(tid, txn_key, result)]
        self.to_mat = []                       # [(txn_key, result)] marker written, offsets not yet materialized

    def _st(self, tid):
        st = self.tids.get(tid)
        if st is None:
            st = self.tids[tid] = dict(epoch=-1, status='Empty', cur=None, seq=0, parts=set())
        return st

    def init(self, tid):
        st = self._st(tid)
        if st['status'] in ('PrepareCommit', 'PrepareAbort'):
            return BLOCKED                     # CONCURRENT_TRANSACTIONS, client retries
        if st['status'] == 'Ongoing':
            st['epoch'] += 1                   # fence, abort the ongoing txn, retry
            self._end(tid, st, 'abort')
            self.w.log(f"  K: init {tid} aborts ongoing {st['cur']} (epoch->{st['epoch']})")
            return BLOCKED
        st['epoch'] += 1
        st['status'] = 'Empty'
        return st['epoch']

    def _check(self, tid, epoch):
        st = self._st(tid)
        if epoch != st['epoch']:
            raise Fenced(tid)
        if st['status'] in ('PrepareCommit', 'PrepareAbort'):
            return st, BLOCKED
        if st['status'] != 'Ongoing':
            st['seq'] += 1
            st['cur'] = (tid, epoch, st['seq'])
            st['status'] = 'Ongoing'
            st['parts'] = set()
            self.txn[st['cur']] = 'open'
        return st, None

    def produce(self, tid, epoch, tp, value):
        st, b = self._check(tid, epoch)
        if b is BLOCKED:
            return BLOCKED
        self.logs[tp].append((value, st['cur']))
        return True

    def send_offsets(self, tid, epoch, group, tp, off, meta=None):
        # TxnOffsetCommit with generation -1 / empty member id: accepted without
        # group membership (GroupCoordinator.validateOffsetCommit, isTransactional).
        st, b = self._check(tid, epoch)
        if b is BLOCKED:
            return BLOCKED
        self.pending[(group, tp)][st['cur']] = (off, meta)   # offset and its metadata
        return True

    def commit(self, tid, epoch):
        st = self._st(tid)
        if epoch != st['epoch']:
            raise Fenced(tid)
        if st['status'] != 'Ongoing':
            return True
        self._end(tid, st, 'commit')           # EndTxn returns after PrepareCommit
        return True

    def abort(self, tid, epoch):
        st = self._st(tid)
        if epoch == st['epoch'] and st['status'] == 'Ongoing':
            self._end(tid, st, 'abort')

    def _end(self, tid, st, result):
        st['status'] = 'PrepareCommit' if result == 'commit' else 'PrepareAbort'
        self.markers.append((tid, st['cur'], result))

    def deliver_marker(self, i):
        tid, key, result = self.markers.pop(i)
        self.txn[key] = result
        # The group coordinator moves pending txn offsets to committed asynchronously after the
        # marker is written (GroupMetadataManager.scheduleHandleTxnCompletion): separate step.
        self.to_mat.append((key, result))
        st = self.tids[tid]
        if st['cur'] == key:
            st['status'] = 'CompleteCommit' if result == 'commit' else 'CompleteAbort'
        self.w.log(f"  K: marker {result} {key}")

    def materialize(self, i):
        key, result = self.to_mat.pop(i)
        for gtp, pend in self.pending.items():
            if key in pend:
                off = pend.pop(key)
                if result == 'commit':
                    self.offsets[gtp] = off     # overwrite: offsets can move backwards
        self.w.log(f"  K: offsets of {key} materialized ({result})")

    def timeout_abort(self, tid):
        st = self.tids[tid]
        st['epoch'] += 1                       # coordinator-side abort bumps the epoch
        self._end(tid, st, 'abort')
        self.w.log(f"  K: txn timeout abort {st['cur']}")

    def fetch_offsets(self, group, tps, require_stable):
        out = {}
        for tp in tps:
            if require_stable and self.pending.get((group, tp)):
                return BLOCKED                 # UNSTABLE_OFFSET_COMMIT, client retries
            out[tp] = self.offsets.get((group, tp), (-1, None))
        return out

    def lso(self, tp):
        for i, (_, k) in enumerate(self.logs[tp]):
            if k is not None and self.txn[k] == 'open':
                return i
        return len(self.logs[tp])

    def read_committed(self, tp, a, b):
        if self.lso(tp) <= b:
            return BLOCKED
        return [(i, v) for i, (v, k) in enumerate(self.logs[tp][a:b + 1], a)
                if k is None or self.txn[k] == 'commit']

    def read_uncommitted(self, tp, a, b):
        return [(i, v) for i, (v, k) in enumerate(self.logs[tp][a:b + 1], a)]

    def committed_view(self, tp):
        return [v for v, k in self.logs[tp] if k is None or self.txn.get(k) == 'commit']


# ----------------------------------------------------------------------------- DynamoDB
class Dynamo:
    def __init__(self):
        self.items = {}    # (table, key) -> dict(ver, val, wm{src:o}, outbox{src:[(o,ver,val,in_tp,in_off)]})
        self.hist = defaultdict(dict)   # (table,key) -> {ver: (val, src, o)}

    def update(self, table, key, src, o, delta, in_tp, in_off, prune_below, no_outbox):
        it = self.items.setdefault((table, key), dict(ver=0, val=0, wm={}, outbox=defaultdict(list)))
        if it['wm'].get(src, -1) < o:      # condition: watermark[src] < o
            it['ver'] += 1
            it['val'] += delta
            it['wm'][src] = o
            ob = [e for e in it['outbox'][src] if not (e[3] == in_tp and e[4] < prune_below)]
            ob.append((o, it['ver'], it['val'], in_tp, in_off))
            it['outbox'][src] = ob
            self.hist[(table, key)][it['ver']] = (it['val'], src, o)
            return it['ver'], it['val'], True
        if no_outbox:                      # mutation: re-derive from current state
            return it['ver'], it['val'], False
        for e in it['outbox'][src]:
            if e[0] == o:
                return e[1], e[2], False
        raise Missing((table, key, src, o))


# ----------------------------------------------------------------------------- windows
WSIZE = 3          # tumbling windows of 3 ms, grace 0: window w = [3w, 3w + 3) closes at 3w + 3


class Windows:
    """Stage 1's windowed count emitted on close, in DynamoDB.

    One item per (key, window): count, version, watermark per source partition, and its
    place in the `closing` index: `cq` is 'open' (closable once the low watermark reaches
    the window's end), ('claimed', tp) with `claimers` (the attempts of tp that claimed it,
    in order; the first claim's offset under the mutation offset_keyed), or 'closed'
    (emitted and finished: out of the index).  Every write to an item is atomic and
    conditional.  The index (a GSI) is eventually consistent: `idx` is what a Query sees,
    `idx_pending` the item changes not propagated yet.  `entries[tp]` is a strongly
    consistent register (one base-table item per partition) of the windows tp's attempts
    claimed or meant to claim: written before the claim, pruned once the window is closed
    or claimed by another partition.  `stream[tp]`: the persisted stream time."""

    def __init__(self, world):
        self.w = world
        self.items = {}
        self.stream = {}
        self.entries = defaultdict(set)
        self.idx = {}
        self.idx_pending = []
        self.late_writes = []
        self.late_claims = set()               # (window, attempt): statistics only

    def _index(self, wk, view):
        self.idx_pending.append((wk, view))

    def propagate(self, rng):
        wks = sorted({wk for wk, _ in self.idx_pending})
        wk = rng.choice(wks)
        for i, (k, view) in enumerate(self.idx_pending):
            if k == wk:                        # in order per item
                del self.idx_pending[i]
                self.idx[wk] = view
                return

    def propagate_all(self):
        for wk, view in self.idx_pending:
            self.idx[wk] = view
        self.idx_pending = []

    def write(self, key, ts, src, o):
        wk = (key, ts // WSIZE)
        it = self.items.get(wk)
        if it is None:
            it = self.items[wk] = dict(cnt=0, ver=0, wm={}, cq='open', claimers=[],
                                       end=(ts // WSIZE + 1) * WSIZE)
            self._index(wk, 'open')
        if it['wm'].get(src, -1) < o:
            if it['cq'] != 'open':
                self.late_writes.append((wk, src, o, it['cq']))
            it['cnt'] += 1
            it['ver'] += 1
            it['wm'][src] = o

    def advance(self, tp, t):
        self.stream[tp] = max(self.stream.get(tp, -1), t)

    def low(self):
        return min(self.stream.get(tp, -1) for tp in self.w.src)

    def gsi_closable(self, low):
        return sorted(wk for wk, view in self.idx.items()
                      if view == 'open' and self.items[wk]['end'] <= low)

    def gsi_claims(self, tp):
        return sorted(wk for wk, view in self.idx.items() if view == ('claimed', tp))

    def claim(self, wk, tp, tag, low):
        it = self.items[wk]
        if it['cq'] != 'open' or it['end'] > low:
            return False
        it['cq'], it['claimers'] = ('claimed', tp), [tag]
        self._index(wk, it['cq'])
        return True

    def reclaim(self, wk, tp, expected, attempt, replace):
        it = self.items[wk]
        if it['cq'] != ('claimed', tp) or it['claimers'] != expected:
            return False
        it['claimers'] = [attempt] if replace else expected + [attempt]
        return True

    def finish(self, wk, tp, expected):
        it = self.items[wk]
        if it['cq'] != ('claimed', tp) or it['claimers'] != expected:
            return False
        it['cq'] = 'closed'
        self._index(wk, 'closed')
        return True

    def prune(self, tp, wk):
        self.entries[tp].discard(wk)


# ----------------------------------------------------------------------------- closing pass
CSIZE = 2          # the closing-pass store's windows: w = [2w, 2w + 2) closes at 2w + 2


class Closing:
    """Stage 1's second windowed count emitted on close, in the shape of sessions and
    sliding windows: ONE item per key holding all of the key's windows, each with its
    count and an `emitted` flag.  Arrivals keep writing the item (its version grows) while
    some of its windows are closed; the closing pass reads the items the (lagging) `closing`
    index shows, computes from the item read what closed, and rewrites the item marking it
    emitted, on the condition that its version is the one read.

    Under exactly-once output that rewrite is the claim: it also stores, in a claim slot of
    the item named by the version it rewrote (unique: the next rewrite needs a higher
    version), the owner partition, the attempts (first claimer first) and the payload: the
    very records it emits.  `entries[tp]` is tp's strongly consistent claim register of
    (key, slot), written before the rewrite.  Resolving a slot: finished (removed) when an
    attempt of it committed, else re-claimed (attempt appended) and its payload emitted
    again; a slot not in the item is forgotten only once the item's version is past it
    (before that, a claim of that slot may still be under way)."""

    def __init__(self, world):
        self.w = world
        self.items = {}
        self.entries = defaultdict(set)
        self.idx = {}                          # key -> next close time, as the index shows it
        self.idx_pending = []
        self.late_writes = []

    def next_close(self, it):
        ends = [(w + 1) * CSIZE for w, (_, done) in it['wins'].items() if not done]
        return min(ends) if ends else None

    def _index(self, key):
        self.idx_pending.append((key, self.next_close(self.items[key])))

    def propagate(self, rng):
        keys = sorted({k for k, _ in self.idx_pending})
        key = rng.choice(keys)
        for i, (k, view) in enumerate(self.idx_pending):
            if k == key:
                del self.idx_pending[i]
                self.idx[key] = view
                return

    def propagate_all(self):
        for key, view in self.idx_pending:
            self.idx[key] = view
        self.idx_pending = []

    def write(self, key, ts, src, o, low0, first, mut):
        """An arrival, in the shape of a left or outer stream–stream join's: the same
        conditional write that adds the record also closes the key's windows that the
        closing time as the batch started (`low0`) has passed, and keeps their records in
        the item, attributed to the arriving record (src, o), until a later batch of `src`
        writes the item (offsets below the batch's `first`).  Returns the records the
        arrival emits, in src's transaction: those kept for it (also when a retry finds the
        write already applied)."""
        it = self.items.setdefault(key, dict(ver=0, wins={}, wm={}, claims={}, outs={}))
        if it['wm'].get(src, -1) < o:
            it['outs'] = {k: v for k, v in it['outs'].items() if k[0] != src or k[1] >= first}
            win = it['wins'].setdefault(ts // CSIZE, [0, False])
            if win[1]:
                self.late_writes.append((key, ts // CSIZE, src, o))
            win[0] += 1
            it['ver'] += 1
            it['wm'][src] = o
            payload = []
            if low0 is not None:
                for w in sorted(it['wins']):
                    cnt, done = it['wins'][w]
                    if not done and (w + 1) * CSIZE <= low0:
                        it['wins'][w][1] = True
                        payload.append(('ses', key, w, cnt, it['ver'], src, 'arrival'))
            self._index(key)
            if 'arrival_outputs_not_kept' in mut:
                return payload
            if payload:
                it['outs'][(src, o)] = payload
        if 'arrival_outputs_not_kept' in mut:
            return []
        return list(it['outs'].get((src, o), []))

    def query(self, low):
        return sorted(k for k, at in self.idx.items() if at is not None and at <= low)

    def read(self, key):
        it = self.items[key]                   # strongly consistent
        return it['ver'], {w: list(v) for w, v in it['wins'].items()}

    def rewrite(self, key, ver, wins, claim, versioned=True):
        """The closing rewrite (and, with `claim` = (slot, tp, attempts, payload), the
        claim), on the condition `ver = :read`."""
        it = self.items[key]
        if versioned and it['ver'] != ver:
            return False
        for w, v in wins.items():
            if v[1]:
                it['wins'][w][1] = True
        it['ver'] += 1
        if claim is not None:
            slot, tp, attempts, payload = claim
            it['claims'][slot] = [tp, list(attempts), list(payload)]
        self._index(key)
        return True

    def reclaim(self, key, slot, tp, expected, attempt, replace):
        c = self.items[key]['claims'].get(slot)
        if c is None or c[0] != tp or c[1] != expected:
            return False
        c[1] = [attempt] if replace else expected + [attempt]
        return True

    def finish(self, key, slot, tp, expected):
        c = self.items[key]['claims'].get(slot)
        if c is None or c[0] != tp or c[1] != expected:
            return False
        del self.items[key]['claims'][slot]
        return True


# ----------------------------------------------------------------------------- world
class Env:
    def __init__(self, eid):
        self.id = eid
        self.producers = {}     # tp -> (tid, epoch)
        self.busy = False


class Inv:
    def __init__(self, iid, stage, batch, env):
        self.id, self.stage, self.batch, self.env = iid, stage, batch, env
        self.timed_out = False
        self.gen = None


class World:
    def __init__(self, rng, mut, trace=False):
        self.rng, self.mut, self.tracing = rng, set(mut.split('+')), trace
        self.events = []
        self.K = Kafka(self)
        self.D = Dynamo()
        self.W = Windows(self)
        self.C = Closing(self)
        np_ = rng.choice((2, 3))
        self.src = {}
        for p in range(np_):
            n = rng.randint(2, 5)
            recs = []
            t = rng.randint(0, 2)
            for _ in range(n):
                key = rng.choice(('a', 'b', 'c') if p == 0 else ('a', 'b'))  # 'c': single-source key
                t += rng.randint(0, 3)             # event time, non-decreasing per partition
                recs.append((key, rng.randint(1, 9), rng.choice(('x', 'y')), t))
            self.src[f"S{p}"] = recs
        self.esm = {1: {tp: 0 for tp in self.src}, 2: {"R0": 0, "R1": 0}}
        self.busy = {1: {}, 2: {}}
        self.envs = {1: [], 2: []}
        self.invs = []
        self.next_id = 0
        self.p_crash = rng.choice((0.0, 0.01, 0.03))
        self.stats = defaultdict(int)
        self.last_end = {}
        self.p_timeout = rng.choice((0.02, 0.08))
        self.p_index = rng.choice((0.3, 1.0, 5.0))   # how fast the closing index catches up

    def log(self, s):
        if self.tracing:
            self.events.append(s)

    # ------------------------------------------------------------------ ESM
    def avail_end(self, stage, tp):
        return len(self.src[tp]) if stage == 1 else len(self.K.logs[tp])  # stage 2: read_uncommitted

    def can_start(self, stage):
        return [tp for tp, c in self.esm[stage].items()
                if tp not in self.busy[stage] and c < self.avail_end(stage, tp)]

    def start_batch(self, stage):
        free = self.can_start(stage)
        k = self.rng.randint(1, len(free))
        tps = sorted(self.rng.sample(free, k))
        batch = {}
        for tp in tps:
            a = self.esm[stage][tp]
            b = min(self.avail_end(stage, tp) - 1, a + self.rng.randint(0, 3))
            batch[tp] = (a, b)
            prev = self.last_end.get((stage, tp, a))
            if prev is not None and prev != b:
                self.stats['redelivery_with_shifted_end'] += 1
            self.last_end[(stage, tp, a)] = b
        if len(tps) > 1:
            self.stats['multi_partition_batches'] += 1
        envs = [e for e in self.envs[stage] if not e.busy]
        if envs and self.rng.random() < 0.7:
            env = self.rng.choice(envs)
        else:
            env = Env(len(self.envs[stage]))
            self.envs[stage].append(env)
        env.busy = True
        inv = Inv(self.next_id, stage, batch, env)
        self.next_id += 1
        inv.gen = self.run_inv(inv)
        for tp in batch:
            self.busy[stage][tp] = inv.id
        self.invs.append(inv)
        self.log(f"I{inv.id} start stage{stage} env{env.id} {batch}")

    def release(self, inv, ok):
        if not inv.timed_out:
            for tp, (a, b) in inv.batch.items():
                if ok:
                    self.esm[inv.stage][tp] = max(self.esm[inv.stage][tp], b + 1)
                self.busy[inv.stage].pop(tp, None)
        self.log(f"I{inv.id} {'success' if ok else 'FAIL'}{' (zombie, ignored by ESM)' if inv.timed_out else ''}")

    def crash(self, inv):
        self.stats['crashes'] += 1
        self.log(f"I{inv.id} CRASH")
        inv.gen.close()
        self.invs.remove(inv)
        if not inv.timed_out:
            for tp in inv.batch:
                self.busy[inv.stage].pop(tp, None)
        self.envs[inv.stage].remove(inv.env)   # environment is discarded

    def esm_timeout(self, inv):
        self.stats['esm_timeouts(zombies)'] += 1
        inv.timed_out = True
        for tp in inv.batch:
            self.busy[inv.stage].pop(tp, None)
        self.log(f"I{inv.id} TIMEOUT declared by ESM (keeps running)")

    # ------------------------------------------------------------------ invocation
    def tid(self, inv, tp):
        if 'no_fencing' in self.mut:
            return f"st{inv.stage}-{tp}-inv{inv.id}"     # no stable transactional.id
        return f"st{inv.stage}-{tp}"

    def run_inv(self, inv):
        K, D, m, st = self.K, self.D, self.mut, inv.stage
        group = f"shadow{st}"
        tps = list(inv.batch)
        prods = {}

        def ensure_producers():
            for tp in tps:
                tid = self.tid(inv, tp)
                cached = inv.env.producers.get(tp)
                if cached is not None and cached[0] == tid and 'no_reuse' not in self.mut:
                    prods[tp] = cached
                    self.stats['producer_reuse'] += 1
                    self.log(f"I{inv.id} reuse producer {tid} epoch {cached[1]}")
                    continue
                while True:
                    e = K.init(tid)
                    if e is BLOCKED:
                        self.stats['init_waits'] += 1
                        yield
                        continue
                    break
                prods[tp] = (tid, e)
                inv.env.producers[tp] = (tid, e)
                self.log(f"I{inv.id} init {tid} -> epoch {e}")
                yield

        def fetch():
            while True:
                r = K.fetch_offsets(group, tps, require_stable=('no_require_stable' not in m))
                if r is BLOCKED:
                    self.stats['require_stable_waits'] += 1
                    yield
                    continue
                self.log(f"I{inv.id} fetch shadow {r}")
                return r

        def produce(tp, otp, v):
            tid, ep = prods[tp]
            while True:
                r = K.produce(tid, ep, otp, v)
                if r is BLOCKED:
                    yield
                    continue
                break
            self.log(f"I{inv.id} produce {tid}/e{ep} {otp} {v}")

        W, X = self.W, f"A{inv.id}"            # X: this attempt's id (random 128 bits in Rust)
        produced = {tp: False for tp in tps}
        mine = []                               # windows this attempt claimed or re-claimed

        def emit_window(tp, wk, how):
            it = W.items[wk]
            produced[tp] = True
            mine.append(wk)
            self.stats[how] += 1
            yield from produce(tp, "WIN", ('win', wk[0], wk[1], it['cnt'], it['ver'], tp, X))

        def resolve(tp, A, s_tp, a, b):
            """The claims of tp: finish the committed attempt's, re-claim the others."""
            if 'gsi_discovery' in m:
                cands = W.gsi_claims(tp)
            else:
                cands = sorted(W.entries[tp])   # strongly consistent register
            self.log(f"I{inv.id} claims of {tp} (last committed {A}): {cands}")
            yield
            for wk in cands:
                while True:
                    it = W.items[wk]            # strongly consistent read
                    if it['cq'] != ('claimed', tp):
                        if it['cq'] == 'closed' or (it['cq'] != 'open' and it['cq'][1] != tp):
                            W.prune(tp, wk)     # never tp's again
                        break
                    cl = list(it['claimers'])
                    if 'offset_keyed' in m:
                        o = cl[0]
                        if o < s_tp:
                            if W.finish(wk, tp, cl):
                                W.prune(tp, wk)
                                break
                            continue
                        if a <= o <= b:
                            yield from emit_window(tp, wk, 'claims_emitted_by_offset')
                        break
                    committed = A in cl
                    if committed:
                        if 'no_finish' in m:
                            break
                        if W.finish(wk, tp, cl):
                            W.prune(tp, wk)
                            self.stats['claims_finished_by_a_later_batch'] += 1
                            if cl[-1] != A:
                                self.stats['committed_claims_taken_over_by_a_zombie'] += 1
                            self.log(f"I{inv.id} finish {wk} (claimers {cl})")
                            break
                        continue
                    if 'no_reclaim' in m:
                        break
                    if W.reclaim(wk, tp, cl, X, replace='no_history' in m):
                        if (wk, cl[-1]) in W.late_claims:
                            self.stats['zombie_claims_after_a_later_commit_reclaimed'] += 1
                        self.log(f"I{inv.id} re-claim {wk} (claimers {cl})")
                        yield from emit_window(tp, wk, 'reclaims')
                        break
                yield

        C, mine_c = self.C, []                 # closing claims (key, slot) this attempt made

        def emit_payload(tp, key, slot, payload, how):
            produced[tp] = True
            mine_c.append((key, slot))
            self.stats[how] += 1
            for rec in payload:
                yield from produce(tp, "SES", rec)

        def resolve_closing(tp, A):
            """tp's claims of closing-pass rewrites: the same decisions as `resolve`, on
            claim slots (key, version rewritten) instead of window items."""
            cands = sorted(C.entries[tp])       # strongly consistent register
            yield
            for key, slot in cands:
                while True:
                    it = C.items[key]           # strongly consistent read
                    c = it['claims'].get(slot)
                    if c is None:
                        # Not (or no longer) claimed: forgotten once no claim of the slot
                        # can land any more (the rewrite needs version = slot).
                        if it['ver'] > slot or 'close_forget_open' in m:
                            C.entries[tp].discard((key, slot))
                        break
                    if c[0] != tp:
                        C.entries[tp].discard((key, slot))
                        break
                    cl = list(c[1])
                    if A in cl:
                        if 'no_finish' in m:
                            break
                        if C.finish(key, slot, tp, cl):
                            C.entries[tp].discard((key, slot))
                            self.stats['closing_claims_finished_by_a_later_batch'] += 1
                            break
                        continue
                    if 'no_reclaim' in m:
                        break
                    if C.reclaim(key, slot, tp, cl, X, replace='no_history' in m):
                        self.log(f"I{inv.id} re-claim closing {key}@{slot} (claimers {cl})")
                        yield from emit_payload(tp, key, slot, c[2], 'closing_reclaims')
                        break
                yield

        def close_items(low):
            """The closing pass of the per-key store: per item the index shows, read,
            register, rewrite-and-claim on the version read, then emit the payload."""
            tp0 = tps[0]
            keys = C.query(low)
            yield
            for key in keys:
                for _ in range(4):              # conflicts: read again (CLOSE_ATTEMPTS)
                    ver, wins = C.read(key)
                    payload = []
                    for w in sorted(wins):
                        cnt, done = wins[w]
                        if not done and (w + 1) * CSIZE <= low:
                            wins[w][1] = True
                            payload.append(('ses', key, w, cnt, ver + 1, tp0, X))
                    if not payload:
                        break
                    yield
                    if 'close_no_claim' in m:
                        # The at-least-once pass: emit, then rewrite on the version.
                        for rec in payload:
                            yield from produce(tp0, "SES", rec)
                        produced[tp0] = True
                        yield
                        if C.rewrite(key, ver, wins, None):
                            break
                        continue
                    slot = 0 if 'close_single_slot' in m else ver
                    if 'close_register_after_claim' not in m:
                        C.entries[tp0].add((key, slot))  # the register first
                        yield
                    ok = C.rewrite(key, ver, wins, (slot, tp0, [X], payload),
                                   versioned='close_no_version_condition' not in m)
                    yield
                    if not ok:
                        continue
                    if 'close_register_after_claim' in m:
                        C.entries[tp0].add((key, slot))
                        yield
                    self.log(f"I{inv.id} claim closing {key}@{slot} for {tp0}: {payload}")
                    yield from emit_payload(tp0, key, slot, payload, 'closing_claims')
                    break
                yield

        def close_pass(s, meta):
            for tp in tps:                      # after the batch's writes
                a, b = inv.batch[tp]
                if b >= a:
                    W.advance(tp, max(self.src[tp][o][3] for o in range(a, b + 1)))
            yield
            low = W.low()                       # the clock read again
            yield
            for tp in tps:
                a, b = inv.batch[tp]
                yield from resolve(tp, meta[tp], s[tp], a, b)
            tp0 = tps[0]
            closable = W.gsi_closable(low)
            self.log(f"I{inv.id} closable at {low}: {closable}")
            yield
            for wk in closable:
                W.entries[tp0].add(wk)          # the register first, then the claim
                yield
                tag = inv.batch[tp0][1] if 'offset_keyed' in m else X
                if W.claim(wk, tp0, tag, low):
                    self.log(f"I{inv.id} claim {wk} for {tp0}")
                    last = K.offsets.get((group, tp0), (-1, None))[1]
                    if last is not None and int(last[1:]) > inv.id:
                        # A zombie's claim, made after a later attempt of its partition
                        # committed (the hole of offset-keyed claims).
                        W.late_claims.add((wk, X))
                        self.stats['zombie_claims_after_a_later_commit'] += 1
                    yield from emit_window(tp0, wk, 'claims')
                yield
            for tp in tps:
                yield from resolve_closing(tp, meta[tp])
            yield from close_items(low)

        try:
            if 'fetch_before_init' in m:
                r = yield from fetch()
                yield
                yield from ensure_producers()
            else:
                yield from ensure_producers()
                r = yield from fetch()
                yield
            s = {tp: r[tp][0] for tp in tps}
            low0 = W.low()                      # the join's closing time as the batch starts
            meta = {tp: r[tp][1] for tp in tps}
            finish_after_commit = self.rng.random() < 0.5
            for tp in tps:
                tid, ep = prods[tp]
                a, b = inv.batch[tp]
                # ---- records of this partition
                if st == 1:
                    recs = [(o, self.src[tp][o]) for o in range(a, b + 1)]
                elif 'trust_esm_payload' in m:
                    recs = K.read_uncommitted(tp, a, b)
                else:
                    while True:
                        recs = K.read_committed(tp, a, b)
                        if recs is BLOCKED:
                            yield
                            continue
                        break
                    self.log(f"I{inv.id} refetch read_committed {tp}[{a}..{b}] -> {len(recs)} recs")
                for o, rec in recs:
                    if st == 1:                 # the windowed count: state only, emitted on close
                        W.write(rec[0], rec[3], tp, o)
                        arrived = C.write(rec[0], rec[3], tp, o, low0, a, m)
                    emit = (o >= s[tp]) or 'no_shadow_check' in m
                    if not emit:
                        continue
                    if st == 1:
                        key, delta, rkey, _ = rec
                        src, so = tp, o
                        outs = [("OUT0", ('s', tp, o))]
                    else:
                        _, rkey_, src, so, delta = rec
                        key = rkey_
                        outs = [("OUT2_0", ('s2', src, so))]
                    try:
                        ver, val, fresh = D.update(f"T{st}", key, src, so, delta, tp, o, s[tp],
                                                   'no_outbox' in m)
                    except Missing:
                        if 'no_shadow_check' in m:
                            it = D.items[(f"T{st}", key)]
                            ver, val, fresh = it['ver'], it['val'], False
                        else:
                            raise Fenced("outbox entry pruned: a newer txn committed")
                    self.log(f"I{inv.id} ddb {key}<-{src}@{so} ver {ver} ({'applied' if fresh else 'outbox'})")
                    yield
                    if st == 1:
                        outs.append((f"AGG{'ab c'.index(key) % 2}", ('agg', key, ver, val, src, so)))
                        outs.append((f"R{0 if rkey == 'x' else 1}", ('rep', rkey, tp, o, delta)))
                    else:
                        outs.append(("AGG2_0", ('agg2', key, ver, val, src, so)))
                    for otp, v in outs:
                        yield from produce(tp, otp, v)
                        produced[tp] = True
                        yield
                    if st == 1:
                        # What the arrival closed, kept in the item with it: in its
                        # partition's transaction (a left or outer join's records alone).
                        for v in arrived:
                            yield from produce(tp, "SES", v)
                            produced[tp] = True
                            self.stats['arrival_closes'] += 1
                            yield
            if st == 1:
                yield from close_pass(s, meta)
            for tp in tps:
                tid, ep = prods[tp]
                a, b = inv.batch[tp]
                new = b + 1 if 'no_max_rule' in m else max(s[tp], b + 1)
                if not produced[tp] and new == s[tp]:
                    continue
                while True:
                    r = K.send_offsets(tid, ep, group, tp, new, X)
                    if r is BLOCKED:
                        yield
                        continue
                    break
                self.log(f"I{inv.id} send_offsets {tid}/e{ep} {tp}->{new} attempt {X}")
                yield
                K.commit(tid, ep)
                if inv.timed_out:
                    self.stats['commits_by_zombies'] += 1
                self.log(f"I{inv.id} commit {tid}/e{ep}")
                yield
            if st == 1 and finish_after_commit and 'no_finish' not in m and 'offset_keyed' not in m:
                for wk in mine:                 # its own claims, committed: finish them now
                    it = W.items[wk]
                    if it['cq'] not in ('open', 'closed') and X in it['claimers']:
                        ctp = it['cq'][1]
                        if W.finish(wk, ctp, list(it['claimers'])):
                            W.prune(ctp, wk)
                            self.stats['claims_finished_after_commit'] += 1
                    yield
                for key, slot in mine_c:
                    c = C.items[key]['claims'].get(slot)
                    if c is not None and X in c[1]:
                        if C.finish(key, slot, c[0], list(c[1])):
                            C.entries[c[0]].discard((key, slot))
                            self.stats['closing_claims_finished_after_commit'] += 1
                    yield
            return True
        except Fenced as f:
            self.stats['fenced_invocations'] += 1
            self.log(f"I{inv.id} fenced ({f})")
            for tp, (tid, ep) in prods.items():
                K.abort(tid, ep)
                if inv.env.producers.get(tp) == (tid, ep):
                    del inv.env.producers[tp]
            return False

    # ------------------------------------------------------------------ scheduler
    def done(self):
        s1 = all(self.esm[1][tp] == len(r) for tp, r in self.src.items())
        s2 = s1 and all(self.esm[2][r] == len(self.K.logs[r]) for r in ("R0", "R1")) \
            and all(self.K.lso(r) == len(self.K.logs[r]) for r in ("R0", "R1"))
        return s1, s2

    def run(self, max_steps):
        rng = self.rng
        for step in range(max_steps):
            s1, s2 = self.done()
            if s1 and s2 and not self.invs and not self.K.markers and not self.K.to_mat:
                return True
            acts = []
            for stage in (1, 2):
                if self.can_start(stage):
                    acts.append((1.0, 'start', stage))
            for inv in self.invs:
                acts.append((3.0, 'step', inv))
                if not inv.timed_out:
                    acts.append((self.p_timeout, 'esm_timeout', inv))
            if self.K.markers:
                acts.append((1.0, 'marker', None))
            if self.K.to_mat:
                acts.append((1.0, 'materialize', None))
            if self.W.idx_pending:
                acts.append((self.p_index, 'index', None))
            if self.C.idx_pending:
                acts.append((self.p_index, 'cindex', None))
            ongoing = [t for t, v in self.K.tids.items() if v['status'] == 'Ongoing']
            if ongoing:
                acts.append((0.03, 'txn_timeout', rng.choice(ongoing)))
            if not acts:
                # everything blocked on an open txn of a dead invocation: time passes
                return False
            tot = sum(a[0] for a in acts)
            x = rng.random() * tot
            for w, kind, arg in acts:
                x -= w
                if x <= 0:
                    break
            if kind == 'start':
                self.start_batch(arg)
            elif kind == 'step':
                inv = arg
                if rng.random() < self.p_crash:
                    self.crash(inv)
                    continue
                try:
                    next(inv.gen)
                except StopIteration as e:
                    self.invs.remove(inv)
                    inv.env.busy = False
                    self.release(inv, bool(e.value))
            elif kind == 'esm_timeout':
                self.esm_timeout(arg)
            elif kind == 'marker':
                self.deliver_marker_random()
            elif kind == 'materialize':
                self.K.materialize(rng.randrange(len(self.K.to_mat)))
            elif kind == 'txn_timeout':
                self.K.timeout_abort(arg)
            elif kind == 'index':
                self.W.propagate(rng)
            elif kind == 'cindex':
                self.C.propagate(rng)
        return False

    def deliver_marker_random(self):
        self.K.deliver_marker(self.rng.randrange(len(self.K.markers)))

    def flush(self):
        """After the run: one more batch per source partition, with no records and no
        faults (what the partition's next batch does, in a deployment where records keep
        coming): claims of attempts that aborted after their partition's last batch, and
        windows the lagging index did not show, are emitted by it.  Returns False when a
        flush batch could not finish."""
        self.W.propagate_all()
        self.C.propagate_all()
        for tp in sorted(self.src):
            env = Env(len(self.envs[1]))
            self.envs[1].append(env)
            n = len(self.src[tp])
            inv = Inv(self.next_id, 1, {tp: (n, n - 1)}, env)
            self.next_id += 1
            gen = self.run_inv(inv)
            self.log(f"I{inv.id} FLUSH batch of {tp}")
            for _ in range(10000):
                try:
                    next(gen)
                except StopIteration as e:
                    if not e.value:
                        return False
                    break
                while self.K.markers:
                    self.K.deliver_marker(0)
                while self.K.to_mat:
                    self.K.materialize(0)
                self.W.propagate_all()
                self.C.propagate_all()
            else:
                return False
            while self.K.markers:
                self.K.deliver_marker(0)
            while self.K.to_mat:
                self.K.materialize(0)
        return True

    def drain(self):
        for inv in list(self.invs):
            inv.gen.close()
        self.invs = []
        for t, v in self.K.tids.items():
            if v['status'] == 'Ongoing':
                self.K.timeout_abort(t)
        while self.K.markers:
            self.K.deliver_marker(0)
        while self.K.to_mat:
            self.K.materialize(0)


# ----------------------------------------------------------------------------- checks
def check(w, complete):
    """Returns (violations, notes).  notes: cross-source order inversions (not claimed)."""
    K, D = w.K, w.D
    v, notes = [], []
    s1, s2 = w.done() if complete else (False, False)
    # stateless OUT and repartition REP: each source record exactly once
    out = defaultdict(int)
    for val in K.committed_view("OUT0"):
        out[(val[1], val[2])] += 1
    rep = defaultdict(int)
    for r in ("R0", "R1"):
        for val in K.committed_view(r):
            rep[(val[2], val[3])] += 1
    for tp, recs in w.src.items():
        for o in range(len(recs)):
            for name, c in (("OUT", out[(tp, o)]), ("REP", rep[(tp, o)])):
                if c > 1 or (s1 and c != 1):
                    v.append(f"{name}: source record {tp}@{o} appears {c} times")
    # stage-2 stateless OUT2: each committed REP record exactly once
    out2 = defaultdict(int)
    for val in K.committed_view("OUT2_0"):
        out2[(val[1], val[2])] += 1
    for k, c in out2.items():
        if c > 1:
            v.append(f"OUT2: record {k} appears {c} times")
    if s2:
        for k in rep:
            if out2[k] != 1:
                v.append(f"OUT2: committed REP record {k} appears {out2[k]} times")
    for k in out2:
        if rep.get(k, 0) == 0:
            v.append(f"OUT2: output for {k} whose REP record is not committed")
    # aggregates
    for table, tps, stage_done in (("T1", ("AGG0", "AGG1"), s1), ("T2", ("AGG2_0",), s2)):
        seq = defaultdict(list)
        for tp in tps:
            for val in K.committed_view(tp):
                seq[val[1]].append(val)
        keys = set(seq) | {k for (t, k) in D.items if t == table}
        for key in keys:
            vs = seq.get(key, [])
            hist = D.hist.get((table, key), {})
            vers = [x[2] for x in vs]
            if len(vers) != len(set(vers)):
                v.append(f"{table}: duplicate (key,version) for {key}: {vers}")
            for x in vs:
                if x[2] not in hist or hist[x[2]][0] != x[3] or hist[x[2]][1:] != (x[4], x[5]):
                    v.append(f"{table}: update {x[1:]} does not match state history {hist.get(x[2])}")
            if stage_done:
                final = D.items.get((table, key), {}).get('ver', 0)
                if sorted(vers) != list(range(1, final + 1)):
                    v.append(f"{table}: key {key} versions {vers} != 1..{final}")
            bysrc = defaultdict(list)
            for x in vs:
                bysrc[x[4]].append(x[2])
            for srcp, l in bysrc.items():
                if l != sorted(l):
                    v.append(f"{table}: key {key} from {srcp} out of order {l}")
            if vers != sorted(vers):
                if table == "T1" and key in ('a', 'b'):
                    notes.append(f"{table}: cross-source key {key} versions in log order {vers}")
                else:
                    v.append(f"{table}: single-source key {key} out of order {vers}")
    # windows emitted on close: each closed window exactly once with its final count, no
    # open window (expected values by brute force from the source records)
    expect = defaultdict(int)
    for recs in w.src.values():
        for key, _, _, t in recs:
            expect[(key, t // WSIZE)] += 1
    final_low = min(recs[-1][3] for recs in w.src.values())
    seen = defaultdict(list)
    for val in K.committed_view("WIN"):
        seen[(val[1], val[2])].append(val[3])
    for wk, cnts in seen.items():
        if len(cnts) > 1:
            v.append(f"WIN: window {wk} emitted {len(cnts)} times {cnts}")
        if (wk[1] + 1) * WSIZE > final_low:
            v.append(f"WIN: open window {wk} emitted (final low watermark {final_low})")
        elif any(c != expect[wk] for c in cnts):
            v.append(f"WIN: window {wk} emitted with count {cnts}, expected {expect[wk]}")
    if w.flushed:
        for wk, c in expect.items():
            if (wk[1] + 1) * WSIZE <= final_low and wk not in seen:
                v.append(f"WIN: closed window {wk} (count {c}) never emitted")
    for lw in w.W.late_writes:
        v.append(f"WIN: write to a window no longer open {lw}")
    # the closing-pass store's windows: the same, by brute force
    cexpect = defaultdict(int)
    for recs in w.src.values():
        for key, _, _, t in recs:
            cexpect[(key, t // CSIZE)] += 1
    cseen = defaultdict(list)
    for val in K.committed_view("SES"):
        cseen[(val[1], val[2])].append(val[3])
    for wk, cnts in cseen.items():
        if len(cnts) > 1:
            v.append(f"SES: window {wk} emitted {len(cnts)} times {cnts}")
        if (wk[1] + 1) * CSIZE > final_low:
            v.append(f"SES: open window {wk} emitted (final low watermark {final_low})")
        elif any(c != cexpect[wk] for c in cnts):
            v.append(f"SES: window {wk} emitted with count {cnts}, expected {cexpect[wk]}")
    if w.flushed:
        for wk, c in cexpect.items():
            if (wk[1] + 1) * CSIZE <= final_low and wk not in cseen:
                v.append(f"SES: closed window {wk} (count {c}) never emitted")
    for lw in w.C.late_writes:
        v.append(f"SES: write to a window already emitted {lw}")
    # state itself exactly once (sanity of the DynamoDB model)
    if s1:
        cnt = defaultdict(int)
        tot = defaultdict(int)
        for recs in w.src.values():
            for key, d, _, _ in recs:
                cnt[key] += 1
                tot[key] += d
        for key in cnt:
            it = D.items.get(("T1", key))
            if it is None or it['ver'] != cnt[key] or it['val'] != tot[key]:
                v.append(f"T1 state {key}: {it and (it['ver'], it['val'])} != {(cnt[key], tot[key])}")
    return v, notes


def run_one(seed, mut, trace=False, max_steps=4000):
    w = World(random.Random(seed), mut, trace)
    complete = w.run(max_steps)
    w.drain()
    w.flushed = False
    if complete:
        before = len(w.K.committed_view("WIN"))
        w.flushed = w.flush()
        if not w.flushed:
            complete = False
        w.stats['windows_emitted_only_by_a_later_batch'] += len(w.K.committed_view("WIN")) - before
    viol, notes = check(w, complete)
    return w, complete, viol, notes


MUTATIONS = [
    ('no_require_stable', 'OffsetFetch without require_stable'),
    ('no_require_stable+no_reuse', 'OffsetFetch without require_stable, fresh init every batch'),
    ('no_fencing', 'transactional.id per invocation (no epoch fencing of zombies)'),
    ('no_shadow_check', 'emit outputs for every record, ignoring the shadow offset'),
    ('fetch_before_init', 'fetch shadow offset before init_transactions'),
    ('no_max_rule', 'commit last+1 instead of max(fetched, last+1)'),
    ('no_outbox', 'retry re-derives aggregate output from current state (no outbox)'),
    ('trust_esm_payload', 'stage 2 uses the ESM payload (read_uncommitted), no read_committed re-fetch'),
    ('offset_keyed', 'window claims keyed by the claiming batch\'s last offset, emitted by the batch '
                     'whose range holds it (the earlier design)'),
    ('no_reclaim', 'claims of attempts that did not commit are left alone (not re-claimed)'),
    ('no_history', 'a re-claim replaces the claimer (the claim keeps only the last attempt)'),
    ('no_finish', 'the committed attempt\'s claims are not finished before the next commit'),
    ('close_no_claim', 'closing pass: emit, then rewrite on the version (the at-least-once pass, no claim)'),
    ('close_single_slot', 'closing pass: one claim slot per item, a new claim replacing a pending one'),
    ('close_forget_open', 'closing pass: a register entry whose slot is not in the item is forgotten '
                          'even while the item\'s version is still the slot (a claim under way)'),
    ('close_register_after_claim', 'closing pass: the register written after the claiming rewrite'),
    ('close_no_version_condition', 'closing pass: the claiming rewrite not conditioned on the version read'),
    ('gsi_discovery', 'a partition\'s claims found through the eventually consistent index, '
                      'not the strongly consistent register'),
    ('arrival_outputs_not_kept', 'an arrival that closes windows (a left or outer join\'s records '
                                 'alone) emits them once when its write applies, not kept in the '
                                 'item for a retry'),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--schedules', type=int, default=20000)
    ap.add_argument('--seed', type=int, default=1)
    ap.add_argument('--mutation-budget', type=int, default=20000)
    ap.add_argument('--show', type=int, default=None, help='print trace of this seed (with --mut)')
    ap.add_argument('--mut', default='none')
    ap.add_argument('--shortest', type=int, default=0,
                    help='with --mut: scan this many seeds, print the shortest failing trace')
    a = ap.parse_args()
    if a.shortest:
        best = None
        for i in range(a.shortest):
            seed = a.seed * 1_000_003 + i
            w, complete, viol, notes = run_one(seed, a.mut)
            if viol:
                w, complete, viol, notes = run_one(seed, a.mut, trace=True)
                if best is None or len(w.events) < len(best[1].events):
                    best = (seed, w, viol)
        if best:
            print(f"seed {best[0]}: {len(best[1].events)} events; violations: {best[2]}")
            print("\n".join(best[1].events))
        return
    if a.show is not None:
        w, complete, viol, notes = run_one(a.show, a.mut, trace=True)
        print("\n".join(w.events))
        print("complete:", complete, "violations:", viol, "notes:", notes)
        return
    t0 = time.time()
    ok = True
    for variant in ('none', 'no_reuse'):
        n_inc = n_note = 0
        stats = defaultdict(int)
        first = None
        for i in range(a.schedules):
            seed = a.seed * 1_000_003 + i
            w, complete, viol, notes = run_one(seed, variant)
            n_inc += not complete
            n_note += bool(notes)
            stats['invocations'] += w.next_id
            for k, x in w.stats.items():
                stats[k] += x
            if viol and first is None:
                first = (seed, viol[:3])
        label = 'protocol' if variant == 'none' else 'protocol, no producer reuse'
        print(f"[{label}] schedules={a.schedules} violations={'NONE' if first is None else first} "
              f"incomplete(liveness, step cap)={n_inc} invocations={stats['invocations']} "
              f"schedules_with_cross-source_version_inversion(not claimed)={n_note}")
        print("    faults exercised: " + ", ".join(f"{k}={x}" for k, x in sorted(stats.items())))
        ok &= first is None
    for mut, desc in MUTATIONS:
        found = None
        for i in range(a.mutation_budget):
            seed = a.seed * 1_000_003 + i
            w, complete, viol, notes = run_one(seed, mut)
            if viol:
                found = (i + 1, seed, viol[0])
                break
        if found:
            print(f"[mutation {mut}: {desc}] first counterexample after {found[0]} schedules, "
                  f"seed {found[1]}: {found[2]}")
        else:
            print(f"[mutation {mut}: {desc}] NO counterexample in {a.mutation_budget} schedules")
            ok = False
    print(f"elapsed {time.time() - t0:.1f}s; result: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == '__main__':
    sys.exit(main())
