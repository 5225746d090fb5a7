"""A lane-level emulation of the KV cache's tensor-core attention kernel (src/cuda/kv_cache_mma.cuh,
fp16), for checking its index math without a GPU: the kernel's steps transcribed per thread and per
warp over an emulated shared memory (ldmatrix with and without .trans, mma.sync m16n8k16 with the
fragment layouts of the PTX ISA, cp.async whose destination reads as NaN from the issue until the
wait that completes its group, so a stage read early or overwritten while in use shows), the
split-KV combine, and a float64 reference. Each case runs the kernel form the library launches
(mma_row_tiles row tiles a block, mma_tile_keys keys a stage, mma_stages stages, the grid of
mma_grid_blocks) unless it overrides tile keys or stages as the timing tool can. It follows the
kernel by hand: change both together.

    python3 scripts/kv_cache_mma_emulation.py            # every case (about ten seconds)
    python3 scripts/kv_cache_mma_emulation.py d256       # one case

Rows as wide as the bucket take copy_tile's compile-time chunk pattern (most cases), the others its
general loop.

Cases: GQA decode over pages of 16 and 7 (splits), D 128 contiguous (three stages), D 40 / Dv 24,
D 17 (element copies), D 256 / Dv 200 (three stages; two at sm80's 163 KB; Q re-read from shared
memory), D 256 over short queries with a window and splits over pages of 7 (also in the timing
tool's 32-key form, two row tiles a block), D 200 / Dv 256 with softcap, short queries with causal masks, a window, softcap, several queries of a group, unaligned
rows. Several row tiles a block: MQA groups of 32 and 24 heads at Lq 1 (two tiles, the second
half-filled at 24) and of 64 (four tiles, Dv 96), a group of 8 over 3, 4 and 5 query tokens (two
tiles; at 5 three tiles in a block of four, one with no valid row; also with a window), 40 rows of
distinct positions whose key slices end inside a row tile's positions (each tile's own mask test),
and D 256 with 5 row tiles (blocks of two, the last with one dead tile). 128-key tiles at D 64 with
splits over pages of 16 and 7 (Dv 48), the timing tool's 64-key tiles at D 64 and a forced 5 stages
at D 128; stage counts 2 to 6 between them. The ring logic also runs under a second legal
interleaving of the threads between barriers.
"""
import math, sys
import numpy as np

kRows, kWarps, kThreads = 16, 4, 128
kMaxStages, kMinStages = 6, 2
kTarget = 113 * 1024
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453

def r16(x): return (x + 15) // 16 * 16

def mma_tile_keys(bucket): return 128 if bucket <= 64 else (64 if bucket <= 128 else 32)

def mma_row_tiles(row_tiles, bucket):
    most = 4 if bucket <= 128 else 2
    tiles = max(1, kWarps * 16 // mma_tile_keys(bucket))
    while tiles < row_tiles and tiles < most: tiles *= 2
    return tiles

class Layout: pass

def layout(D, Dv, stages, row_tiles=1, tile_keys=0):
    s = Layout()
    s.tile_keys = tile_keys if tile_keys > 0 else mma_tile_keys(bucket(D, Dv))
    s.k_pitch = r16(D) + 8; s.v_pitch = r16(Dv) + 8; s.o_pitch = r16(Dv) + 8
    s.v_in_stage = s.tile_keys * s.k_pitch * 2
    s.stage = s.v_in_stage + s.tile_keys * s.v_pitch * 2
    merge = kWarps * kRows * s.o_pitch * 4
    s.ring = max(stages * s.stage, merge)
    s.q = s.ring
    s.offsets = s.q + (row_tiles * kRows * s.k_pitch * 2 + 15) // 16 * 16
    s.stats = s.offsets + 2 * s.tile_keys * 2 * 8
    s.total = s.stats + 4 * kWarps * kRows * 4
    return s

def mma_pair_limit(shared_per_sm, reserved_per_block): return shared_per_sm // 2 - reserved_per_block

def mma_stages(D, Dv, max_shared, row_tiles=1, tile_keys=0, pair_limit=kTarget):
    two = one = 0
    for stages in range(kMinStages, kMaxStages + 1):
        b = layout(D, Dv, stages, row_tiles, tile_keys).total
        if b > max_shared: break
        if b <= pair_limit: two = stages
        one = stages
    return two if two > 0 else one

def bucket(D, Dv):
    m = max(r16(D), r16(Dv))
    return 64 if m <= 64 else (128 if m <= 128 else 256)

# The kernel's static_asserts on the rule.
assert mma_stages(128, 128, 227 * 1024) == 3 and mma_stages(64, 64, 227 * 1024) == 2
assert mma_stages(128, 128, 227 * 1024, 2) == 2 and mma_stages(256, 256, 227 * 1024) == 3
assert mma_stages(256, 256, 163 * 1024, 1, 0, 163 * 1024 // 2) == 2

def clamp(x, lo, hi): return lo if x < lo else (hi if x > hi else x)

class Smem:
    def __init__(self, n):
        self.buf = np.full(n, 0xFF, np.uint8)  # garbage: f16 NaN everywhere
    def u16(self): return self.buf.view(np.uint16)
    def f32(self): return self.buf.view(np.float32)
    def i64(self): return self.buf.view(np.int64)

def f16bits(x): return np.float16(x).view(np.uint16)
def bits2f(b): return float(np.uint16(b).view(np.float16))

# ---- warp primitives -------------------------------------------------------------------------
def ldmatrix_x4(sm, addrs, trans=False):
    """addrs[32]: byte addresses (lane l gives row l%8 of matrix l//8). Returns regs[32][4] as
    pairs (lo, hi) of float."""
    u = sm.u16()
    mats = []
    for j in range(4):
        m = np.zeros((8, 8))
        for r in range(8):
            a = addrs[8 * j + r]
            assert a % 16 == 0, "ldmatrix row address not 16-byte aligned"
            for cc in range(8):
                m[r, cc] = bits2f(u[a // 2 + cc])
        mats.append(m)
    regs = [[None] * 4 for _ in range(32)]
    for l in range(32):
        g, c = l // 4, l % 4
        for j in range(4):
            m = mats[j]
            if not trans:
                regs[l][j] = (m[g, 2 * c], m[g, 2 * c + 1])
            else:
                regs[l][j] = (m[2 * c, g], m[2 * c + 1, g])
    return regs

def mma(d, a, b0, b1):
    """d[32][4] floats, a[32][4] pairs, b0/b1 [32] pairs: PTX m16n8k16 layouts (independent)."""
    A = np.zeros((16, 16)); B = np.zeros((16, 8))
    for l in range(32):
        g, c = l // 4, l % 4
        A[g, 2 * c], A[g, 2 * c + 1] = a[l][0]
        A[g + 8, 2 * c], A[g + 8, 2 * c + 1] = a[l][1]
        A[g, 2 * c + 8], A[g, 2 * c + 9] = a[l][2]
        A[g + 8, 2 * c + 8], A[g + 8, 2 * c + 9] = a[l][3]
        B[2 * c, g], B[2 * c + 1, g] = b0[l]
        B[2 * c + 8, g], B[2 * c + 9, g] = b1[l]
    C = A @ B
    for l in range(32):
        g, c = l // 4, l % 4
        d[l][0] += C[g, 2 * c]; d[l][1] += C[g, 2 * c + 1]
        d[l][2] += C[g + 8, 2 * c]; d[l][3] += C[g + 8, 2 * c + 1]

def q16(x):  # the pack to fp16 and back
    return float(np.float16(x))

# ---- the kernel --------------------------------------------------------------------------------
class P: pass

def query_run(p, b):
    if p.cu_seqlens_q is None: return 0, p.seqlen_q
    start = clamp(p.cu_seqlens_q[b], 0, p.total_q)
    end = clamp(p.cu_seqlens_q[b + 1], start, p.total_q)
    return start, min(end - start, p.seqlen_q)

def row_offset(rows, b, token, h): return b * rows[0] + token * rows[1] + h * rows[2]

def key_rows(p, b, kv_head, key, end):
    """The kernel's key_rows as element offsets into the caches (its row addresses): past the
    split's keys the caches' bases (offset 0), which copy_tile never reads."""
    if key >= end: return 0, 0
    page, row = b, key
    if p.block_table is not None:
        entry = key // p.page_size
        page = clamp(int(p.block_table[b * p.table_batch + entry * p.table_page]), 0, p.num_pages - 1)
        row = key - entry * p.page_size
    return (page * p.k_page + row * p.k_row + kv_head * p.k_head,
            page * p.v_page + row * p.v_row + kv_head * p.v_head)

class Async:
    def __init__(self, sm):
        self.sm = sm
        self.groups = [[] for _ in range(kThreads)]  # committed groups per thread
        self.open = [[] for _ in range(kThreads)]
    def copy16(self, tid, dst, values):  # values: 8 floats (or None = zero fill)
        u = self.sm.u16()
        assert dst % 16 == 0
        u[dst // 2: dst // 2 + 8] = 0xFFFF  # may land any time: poison until the wait
        self.open[tid].append((dst, values))
    def commit(self, tid):
        self.groups[tid].append(self.open[tid]); self.open[tid] = []
    def wait(self, tid, pending):
        u = self.sm.u16()
        while len(self.groups[tid]) > pending:
            for dst, values in self.groups[tid].pop(0):
                for i in range(8):
                    u[dst // 2 + i] = f16bits(0.0 if values is None else values[i])
    def wait_all(self, tid):
        assert not self.open[tid]
        self.wait(tid, 0)

def copy_tile(p, tid, offsets_at, live, stage, L, asy, sm, kTileKeys, kBucket):
    D, Dv = p.head_dim, p.value_dim
    k_cols, v_cols = r16(D), r16(Dv)
    i64 = sm.i64(); u = sm.u16()
    if p.vector_loads and k_cols == kBucket and v_cols == kBucket:  # the compile-time chunk pattern
        kChunks = kBucket // 8; kRowsPerPass = kThreads // kChunks; kPitch = kBucket + 8
        assert kThreads % kChunks == 0 and kTileKeys % kRowsPerPass == 0
        assert kPitch == L.k_pitch == L.v_pitch
        chunk, row0 = tid % kChunks, tid // kChunks
        k_rows = live - row0 if chunk * 8 < D else 0
        v_rows = live - row0 if chunk * 8 < Dv else 0
        for i in range(kTileKeys // kRowsPerPass):
            j = row0 + i * kRowsPerPass
            for part, cache, tile, rows in ((0, p.k_cache, stage, k_rows), (1, p.v_cache, stage + L.v_in_stage, v_rows)):
                offset = int(i64[offsets_at // 8 + j * 2 + part])
                copied = i * kRowsPerPass < rows
                asy.copy16(tid, tile + (j * kPitch + chunk * 8) * 2,
                           cache[offset + chunk * 8: offset + chunk * 8 + 8] if copied else None)
        return
    if p.vector_loads:
        for part in range(2):
            cache = p.k_cache if part == 0 else p.v_cache
            tile = stage if part == 0 else stage + L.v_in_stage
            dim = D if part == 0 else Dv
            chunks = (k_cols if part == 0 else v_cols) // 8
            pitch = L.k_pitch if part == 0 else L.v_pitch
            step_rows, step_chunks = kThreads // chunks, kThreads % chunks
            j, chunk = tid // chunks, tid % chunks
            while j < kTileKeys:
                offset = int(i64[offsets_at // 8 + j * 2 + part])
                copied = j < live and chunk * 8 < dim
                if copied: assert (offset + chunk * 8) % 8 == 0
                asy.copy16(tid, tile + (j * pitch + chunk * 8) * 2,
                           cache[offset + chunk * 8: offset + chunk * 8 + 8] if copied else None)
                j += step_rows; chunk += step_chunks
                if chunk >= chunks: chunk -= chunks; j += 1
        return
    for e in range(tid, kTileKeys * k_cols, kThreads):
        j, d = e // k_cols, e % k_cols
        offset = int(i64[offsets_at // 8 + j * 2])
        u[stage // 2 + j * L.k_pitch + d] = f16bits(p.k_cache[offset + d] if j < live and d < D else 0.0)
    for e in range(tid, kTileKeys * v_cols, kThreads):
        j, d = e // v_cols, e % v_cols
        offset = int(i64[offsets_at // 8 + j * 2 + 1])
        u[(stage + L.v_in_stage) // 2 + j * L.v_pitch + d] = f16bits(p.v_cache[offset + d] if j < live and d < Dv else 0.0)

def cp_async_wait_stages(stages):  # the groups left pending: the kernel's switch
    return {2: 0, 3: 1, 4: 2, 5: 3}.get(stages, 4)

def kernel(p, bx, split, stages, order, kRowTiles, kTileKeys):
    """Block bx (grid x) of split `split` of kv_cache_mma_kernel<half, bucket, kRowTiles, kTileKeys>."""
    D, Dv = p.head_dim, p.value_dim
    kBucket = bucket(D, Dv)
    kKeyGroups = kWarps // kRowTiles  # warps sharing a row tile
    kWarpKeys = kTileKeys // kKeyGroups  # a warp's keys of a stage
    kKeySteps = kWarpKeys // 16  # its k-steps of P V
    kScoreTiles = kWarpKeys // 8  # its n-tiles of S
    kBlockRows = kRowTiles * kRows
    kSteps, kOutTiles = kBucket // 16, kBucket // 8
    kQInRegisters = kBucket <= 128
    assert kWarps % kRowTiles == 0 and kWarpKeys % 16 == 0, "whole k-steps a warp"
    assert kTileKeys <= kThreads, "one thread looks up one key's cache row"
    L = layout(D, Dv, stages, kRowTiles, kTileKeys)
    sm = Smem(L.total); asy = Async(sm)
    d_steps, v_pairs = r16(D) // 16, r16(Dv) // 16
    blocks_per_head = (p.row_tiles + kRowTiles - 1) // kRowTiles
    block_tile = bx % blocks_per_head
    kv_head = (bx // blocks_per_head) % p.kv_heads
    b = bx // blocks_per_head // p.kv_heads
    q_first, q_count = query_run(p, b)
    first_row = block_tile * kBlockRows
    valid_rows = q_count * p.group
    if first_row >= valid_rows: return False  # the whole block is past this sequence's queries
    keys = clamp(int(p.cache_seqlens[b]), 0, p.capacity)
    u = sm.u16()
    cols = r16(D)
    for tid in range(kThreads):
        for e in range(tid, kBlockRows * cols, kThreads):
            r, d = e // cols, e % cols
            row = first_row + r
            value = 0.0
            if row < valid_rows and d < D:
                i = row // p.group
                h = kv_head * p.group + row % p.group
                token = i if p.cu_seqlens_q is None else q_first + i
                value = p.q[row_offset(p.q_rows, b if p.cu_seqlens_q is None else 0, token, h) + d]
            u[L.q // 2 + r * L.k_pitch + d] = f16bits(value)
    last_row = min(valid_rows, first_row + kBlockRows) - 1
    lowest = keys - q_count + first_row // p.group
    highest = keys - q_count + last_row // p.group
    begin = clamp(lowest - p.lower, 0, keys) if p.has_lower else 0
    end = clamp(highest + p.upper + 1, 0, keys) if p.has_upper else keys
    if end < begin: end = begin
    chunk = ((end - begin + p.num_splits - 1) // p.num_splits + kTileKeys - 1) // kTileKeys * kTileKeys
    begin = begin + split * chunk if begin + split * chunk < end else end
    end = begin + chunk if begin + chunk < end else end
    tiles = (end - begin + kTileKeys - 1) // kTileKeys

    i64 = sm.i64()
    nxt = [(0, 0)] * kThreads
    def look_up(uu):
        for tid in range(kTileKeys):
            nxt[tid] = key_rows(p, b, kv_head, begin + uu * kTileKeys + tid, end)
    def publish(uu):
        for tid in range(kTileKeys):
            base = L.offsets // 8 + (uu % 2) * kTileKeys * 2 + tid * 2
            i64[base], i64[base + 1] = nxt[tid]
    def issue(uu):
        for tid in range(kThreads):
            if uu < tiles:
                live = min(end - begin - uu * kTileKeys, kTileKeys)
                copy_tile(p, tid, L.offsets + (uu % 2) * kTileKeys * 2 * 8, live, (uu % stages) * L.stage, L,
                          asy, sm, kTileKeys, kBucket)
            asy.commit(tid)

    look_up(0); publish(0)
    for s in range(stages - 1):
        # barrier
        issue(s); look_up(s + 1); publish(s + 1)

    # per-warp state: its row tile and key slice
    W = []
    for warp in range(kWarps):
        st = {}
        row_tile, key_group = warp // kKeyGroups, warp % kKeyGroups
        st['row_tile'], st['key_group'] = row_tile, key_group
        tile_row = first_row + row_tile * kRows
        st['tile_row'] = tile_row
        st['tile_live'] = tile_row < valid_rows
        tile_last = min(valid_rows, tile_row + kRows) - 1
        st['tile_lowest'] = keys - q_count + tile_row // p.group
        st['tile_highest'] = keys - q_count + tile_last // p.group
        q_addr = []
        k_lane = []; v_lane = []
        for lane in range(32):
            mi, mr = lane // 8, lane % 8
            q_addr.append(L.q + ((row_tile * kRows + mr + (mi % 2) * 8) * L.k_pitch + (mi // 2) * 8) * 2)
            k_lane.append((key_group * kWarpKeys + mr + (mi // 2) * 8) * L.k_pitch + (mi % 2) * 8)
            v_lane.append((key_group * kWarpKeys + mr + (mi % 2) * 8) * L.v_pitch + (mi // 2) * 8)
        st['q_addr'], st['k_lane'], st['v_lane'] = q_addr, k_lane, v_lane
        st['o'] = [[[0.0] * 4 for _ in range(32)] for _ in range(kOutTiles)]
        st['max'] = [[-math.inf, -math.inf] for _ in range(32)]
        st['sum'] = [[0.0, 0.0] for _ in range(32)]
        W.append(st)
    # Q fragments (after the prologue's barrier)
    for st in W:
        st['qf'] = [ldmatrix_x4(sm, [a + ks * 32 for a in st['q_addr']]) if ks < d_steps else None for ks in range(kSteps)] if kQInRegisters else None
    scale_log2 = p.scale * LOG2E

    def compute(t):
        for warp, st in enumerate(W):
            key0 = begin + t * kTileKeys + st['key_group'] * kWarpKeys
            if not (st['tile_live'] and key0 < end): continue
            stage = (t % stages) * L.stage
            k_addr = [stage + kl * 2 for kl in st['k_lane']]
            v_addr = [stage + L.v_in_stage + vl * 2 for vl in st['v_lane']]
            s = [[[0.0] * 4 for _ in range(32)] for _ in range(kScoreTiles)]
            for ks in range(kSteps):
                if ks < d_steps:
                    a = st['qf'][ks] if kQInRegisters else ldmatrix_x4(sm, [q + ks * 32 for q in st['q_addr']])
                    for j in range(kKeySteps):
                        kf = ldmatrix_x4(sm, [k + j * 16 * L.k_pitch * 2 + ks * 32 for k in k_addr])
                        mma(s[2 * j], a, [kf[l][0] for l in range(32)], [kf[l][1] for l in range(32)])
                        mma(s[2 * j + 1], a, [kf[l][2] for l in range(32)], [kf[l][3] for l in range(32)])
            whole = (key0 + kWarpKeys <= end
                     and (not p.has_upper or key0 + kWarpKeys - 1 <= st['tile_lowest'] + p.upper)
                     and (not p.has_lower or key0 >= st['tile_highest'] - p.lower))
            for lane in range(32):
                g, c = lane // 4, lane % 4
                for n in range(kScoreTiles):
                    for e in range(4):
                        x = s[n][lane][e]
                        if p.softcap > 0: x = p.softcap * math.tanh(x * p.scale / p.softcap) * LOG2E
                        else: x *= scale_log2
                        if not whole:
                            h = e // 2
                            row = st['tile_row'] + g + 8 * h
                            key = key0 + 8 * n + 2 * c + (e % 2)
                            position = keys - q_count + row // p.group
                            visible = key < end and row < valid_rows
                            if p.has_upper: visible = visible and key <= position + p.upper
                            if p.has_lower: visible = visible and key >= position - p.lower
                            if not visible: x = -math.inf
                        s[n][lane][e] = x
            rescale = [[0, 0] for _ in range(32)]
            changed = False  # update<kLazyRescale>: O rescaled only when a seen row's max moved
            for h in range(2):
                tm = [max(max(s[n][l][2*h], s[n][l][2*h+1]) for n in range(kScoreTiles)) for l in range(32)]
                tm = [max(tm[(l & ~3) + k] for k in range(4)) for l in range(32)]  # quad_max
                for l in range(32):
                    new_max = max(st['max'][l][h], tm[l])
                    base = 0.0 if new_max == -math.inf else new_max
                    rescale[l][h] = 2.0 ** (st['max'][l][h] - base)
                    changed = changed or (st['max'][l][h] != -math.inf and new_max != st['max'][l][h])
                    st['max'][l][h] = new_max
                    tot = 0.0
                    for n in range(kScoreTiles):
                        s[n][l][2*h] = 2.0 ** (s[n][l][2*h] - base)
                        s[n][l][2*h+1] = 2.0 ** (s[n][l][2*h+1] - base)
                        tot += s[n][l][2*h] + s[n][l][2*h+1]
                    st['sum'][l][h] = st['sum'][l][h] * rescale[l][h] + tot
            for n in range(kOutTiles if changed else 0):
                for l in range(32):
                    o = st['o'][n][l]
                    o[0] *= rescale[l][0]; o[1] *= rescale[l][0]; o[2] *= rescale[l][1]; o[3] *= rescale[l][1]
            for j in range(kKeySteps):
                pf = [((q16(s[2*j][l][0]), q16(s[2*j][l][1])), (q16(s[2*j][l][2]), q16(s[2*j][l][3])),
                       (q16(s[2*j+1][l][0]), q16(s[2*j+1][l][1])), (q16(s[2*j+1][l][2]), q16(s[2*j+1][l][3])))
                      for l in range(32)]
                for n in range(kOutTiles // 2):
                    if n < v_pairs:
                        vf = ldmatrix_x4(sm, [v + j * 16 * L.v_pitch * 2 + n * 32 for v in v_addr], trans=True)
                        mma(st['o'][2*n], pf, [vf[l][0] for l in range(32)], [vf[l][1] for l in range(32)])
                        mma(st['o'][2*n+1], pf, [vf[l][2] for l in range(32)], [vf[l][3] for l in range(32)])

    pend = cp_async_wait_stages(stages)
    for t in range(tiles):
        for tid in range(kThreads): asy.wait(tid, pend)
        # barrier
        if order == 0:
            look_up(t + stages); issue(t + stages - 1); compute(t); publish(t + stages)
        else:  # another legal interleaving: look-ups and publishes of fast threads first
            look_up(t + stages); publish(t + stages); issue(t + stages - 1); compute(t)
    for tid in range(kThreads): asy.wait_all(tid)
    f = sm.f32()
    stats = L.stats // 4
    wsum = stats + kWarps * kRows  # warp_max [kWarps][kRows], then warp_sum
    for warp, st in enumerate(W):
        for h in range(2):
            for l in range(32):
                g, c = l // 4, l % 4
                tot = sum(st['sum'][(l & ~3) + k][h] for k in range(4))
                if c == 0:
                    f[stats + warp * kRows + g + 8 * h] = st['max'][l][h]
                    f[wsum + warp * kRows + g + 8 * h] = tot
    # barrier: the ring is free
    for warp, st in enumerate(W):
        first_warp = st['row_tile'] * kKeyGroups  # of this warp's row tile
        for h in range(2):
            for l in range(32):
                g, c = l // 4, l % 4
                top = max(f[stats + (first_warp + w) * kRows + g + 8 * h] for w in range(kKeyGroups))
                m = st['max'][l][h]
                weight = 0.0 if m == -math.inf else 2.0 ** (m - top)
                out_row = (warp * kRows + g + 8 * h) * L.o_pitch + 2 * c
                for n in range(kOutTiles):
                    if n < 2 * v_pairs:
                        f[out_row + 8 * n] = st['o'][n][l][2*h] * weight
                        f[out_row + 8 * n + 1] = st['o'][n][l][2*h+1] * weight
    bm = wsum + kWarps * kRows; bs = bm + kWarps * kRows  # block_max, block_sum [kBlockRows]
    assert bs + kBlockRows <= L.total // 4 and L.ring >= kWarps * kRows * L.o_pitch * 4
    for tid in range(kBlockRows):
        warp0, r = (tid // kRows) * kKeyGroups, tid % kRows
        top = max(f[stats + (warp0 + w) * kRows + r] for w in range(kKeyGroups))
        tot = 0.0
        for w in range(kKeyGroups):
            m = f[stats + (warp0 + w) * kRows + r]
            if m != -math.inf: tot += f[wsum + (warp0 + w) * kRows + r] * 2.0 ** (m - top)
        f[bm + tid] = top; f[bs + tid] = tot
    # barrier; epilogue
    out_b = b if p.cu_seqlens_q is None else 0
    for tid in range(kThreads):
        for e in range(tid, kBlockRows * Dv, kThreads):
            r, d = e // Dv, e % Dv
            row = first_row + r
            if row >= valid_rows: break
            i = row // p.group
            h = kv_head * p.group + row % p.group
            warp0, tr = (r // kRows) * kKeyGroups, r % kRows
            value = sum(float(f[((warp0 + w) * kRows + tr) * L.o_pitch + d]) for w in range(kKeyGroups))
            max2, tot = float(f[bm + r]), float(f[bs + r])
            token = i if p.cu_seqlens_q is None else q_first + i
            qtok = b * p.seqlen_q + i if p.cu_seqlens_q is None else q_first + i
            if p.num_splits > 1:
                part_row = split * p.total_q * p.heads + qtok * p.heads + h
                p.partial_out[part_row * Dv + d] = value / tot if tot > 0 else 0.0
                if d == 0: p.partial_lse[part_row] = max2 + math.log2(tot) if tot > 0 else -math.inf
                continue
            weight = 1.0 / tot if tot > 0 else 0.0  # no sinks in these cases
            p.out[row_offset(p.out_rows, out_b, token, h) + d] = value * weight
            if d == 0: p.lse[row_offset(p.out_rows_lse, out_b, token, h)] = (max2 + math.log2(tot)) * LN2 if tot > 0 else -math.inf
    return any(not st['tile_live'] for st in W)


# ---- problems, the reference, the combine, the cases ------------------------------------------

def make(B, H, Hkv, D, Dv, lens, Lq, page_size, splits, causal=True, wl=-1, wr=-1, softcap=0.0, seed=0,
         align_pad=0):
    rng = np.random.default_rng(seed)
    p = P()
    p.batch, p.heads, p.kv_heads, p.group = B, H, Hkv, H // Hkv
    p.head_dim, p.value_dim = D, Dv
    p.seqlen_q, p.total_q = Lq, B * Lq
    p.cu_seqlens_q = None
    q = rng.standard_normal(B * Lq * H * D).astype(np.float16).astype(np.float64)
    p.q = q
    p.q_rows = (Lq * H * D, H * D, D)
    p.out_rows = (Lq * H * Dv, H * Dv, Dv)
    p.out_rows_lse = (H * Lq, 1, Lq)
    cap_needed = max(lens) + 3
    if page_size:
        per_seq = -(-cap_needed // page_size)
        pool = B * per_seq + 2
        perm = rng.permutation(pool)
        table = np.array([perm[b * per_seq + j] for b in range(B) for j in range(per_seq)], np.int64)
        p.block_table, p.table_batch, p.table_page = table, per_seq, 1
        p.page_size, p.num_pages, p.capacity = page_size, pool, per_seq * page_size
        rows_per_page, pages = page_size, pool
    else:
        p.block_table = None
        p.page_size, p.num_pages, p.capacity = cap_needed, B, cap_needed
        rows_per_page, pages = cap_needed, B
    kd = D + align_pad; vd = Dv + align_pad  # row pitch of the head (pad breaks alignment if odd)
    p.k_head, p.k_row, p.k_page = kd, Hkv * kd, rows_per_page * Hkv * kd
    p.v_head, p.v_row, p.v_page = vd, Hkv * vd, rows_per_page * Hkv * vd
    p.k_cache = np.full(pages * p.k_page, np.nan)
    p.v_cache = np.full(pages * p.v_page, np.nan)
    # fill the valid rows only (others stay NaN, as the tests poison them)
    for b in range(B):
        for t in range(lens[b]):
            if page_size:
                page = int(p.block_table[b * p.table_batch + t // page_size]); row = t % page_size
            else:
                page, row = b, t
            for hk in range(Hkv):
                ko = page * p.k_page + row * p.k_row + hk * p.k_head
                vo = page * p.v_page + row * p.v_row + hk * p.v_head
                p.k_cache[ko:ko + D] = rng.standard_normal(D).astype(np.float16)
                p.v_cache[vo:vo + Dv] = rng.standard_normal(Dv).astype(np.float16)
    p.cache_seqlens = np.array(lens)
    p.vector_loads = D % 8 == 0 and Dv % 8 == 0 and kd % 8 == 0 and vd % 8 == 0
    p.row_tiles = -(-(Lq * p.group) // 16)
    p.scale = 1.0 / math.sqrt(D) * 1.3
    p.softcap = softcap
    p.has_upper = causal or wr >= 0
    p.upper = (min(wr, 0) if wr >= 0 else 0) if causal else wr
    p.has_lower = wl >= 0
    p.lower = wl
    p.num_splits = splits
    p.partial_out = np.full(splits * p.total_q * H * Dv, np.nan)
    p.partial_lse = np.full(splits * p.total_q * H, np.nan)
    p.out = np.full(B * Lq * H * Dv, np.nan)
    p.lse = np.full(B * H * Lq, np.nan)
    return p

def reference(p, lens):
    B, H, D, Dv, Lq = p.batch, p.heads, p.head_dim, p.value_dim, p.seqlen_q
    out = np.zeros(B * Lq * H * Dv); lse = np.zeros(B * H * Lq)
    for b in range(B):
        keys = lens[b]
        for i in range(Lq):
            pos = keys - Lq + i
            for h in range(H):
                hk = h // p.group
                qv = p.q[row_offset(p.q_rows, b, i, h):][:D]
                sc = []; vs = []
                for j in range(keys):
                    vis = True
                    if p.has_upper: vis = vis and j <= pos + p.upper
                    if p.has_lower: vis = vis and j >= pos - p.lower
                    if not vis: continue
                    page, row = (b, j) if p.block_table is None else (int(p.block_table[b * p.table_batch + j // p.page_size]), j % p.page_size)
                    kv = p.k_cache[page * p.k_page + row * p.k_row + hk * p.k_head:][:D]
                    vv = p.v_cache[page * p.v_page + row * p.v_row + hk * p.v_head:][:Dv]
                    s = float(qv @ kv) * p.scale
                    if p.softcap > 0: s = p.softcap * math.tanh(s / p.softcap)
                    sc.append(s); vs.append(vv)
                o = row_offset(p.out_rows, b, i, h)
                if not sc:
                    out[o:o + Dv] = 0; lse[row_offset(p.out_rows_lse, b, i, h)] = -math.inf; continue
                m = max(sc); w = np.exp(np.array(sc) - m); z = w.sum()
                out[o:o + Dv] = (w[:, None] * np.array(vs)).sum(0) / z
                lse[row_offset(p.out_rows_lse, b, i, h)] = m + math.log(z)
    return out, lse

def combine(p):
    rows = p.total_q * p.heads
    for row in range(rows):
        token, h = row // p.heads, row % p.heads
        l2 = [p.partial_lse[s * rows + row] for s in range(p.num_splits)]
        assert not any(math.isnan(x) for x in l2), ("unwritten partial lse", row)
        m = max(l2)
        ws = [0.0 if (m == -math.inf or x == -math.inf) else 2.0 ** (x - m) for x in l2]
        tot = sum(ws)
        b, i = token // p.seqlen_q, token % p.seqlen_q
        o = row_offset(p.out_rows, b, i, h)
        for d in range(p.value_dim):
            v = sum(ws[s] * p.partial_out[(s * rows + row) * p.value_dim + d] for s in range(p.num_splits) if ws[s] != 0)
            p.out[o + d] = v / tot if tot > 0 else 0.0
        p.lse[row_offset(p.out_rows_lse, b, i, h)] = (m + math.log2(tot)) * LN2 if tot > 0 else -math.inf

def run(name, lens, order=0, max_shared=227 * 1024, tile_keys=0, stages=0, row_tiles=0, **kw):
    """One case as the library launches it (kv_cache.cu's plan, launch_attention); tile_keys / stages /
    row_tiles override the library's choice as the timing tool's options do."""
    p = make(lens=lens, **kw)
    bk = bucket(p.head_dim, p.value_dim)
    keys = tile_keys or mma_tile_keys(bk)
    row_tiles = row_tiles or mma_row_tiles(p.row_tiles, bk)
    # An sm90 SM holds 228 KB (two blocks of up to 113 KB), an sm80 SM 164 KB.
    pair = kTarget if max_shared >= 227 * 1024 else mma_pair_limit(164 * 1024, 1024)
    stages = stages or mma_stages(p.head_dim, p.value_dim, max_shared, row_tiles, keys, pair)
    assert kMinStages <= stages <= kMaxStages
    assert layout(p.head_dim, p.value_dim, stages, row_tiles, keys).total <= max_shared
    blocks = p.batch * p.kv_heads * ((p.row_tiles + row_tiles - 1) // row_tiles)  # mma_grid_blocks
    dead = 0  # live blocks with a row tile past the queries
    for bx in range(blocks):
        for split in range(p.num_splits):
            dead += bool(kernel(p, bx, split, stages, order, row_tiles, keys)) and split == 0
    if p.num_splits > 1: combine(p)
    ref_out, ref_lse = reference(p, lens)
    err = np.nanmax(np.abs(p.out - ref_out)) if not np.isnan(p.out).any() else float('nan')
    lerr = max(abs(a - b) if not (a == b) else 0.0 for a, b in zip(p.lse, ref_lse))
    ok = err < 2e-2 and lerr < 1e-3
    print(f"{name}: bucket {bk} keys {keys} row tiles {row_tiles} ({p.row_tiles} a head, {blocks} blocks, "
          f"{dead} with a dead tile) stages {stages} splits {p.num_splits} vector {p.vector_loads} "
          f"max|out| {np.abs(ref_out).max():.3f} out err {err:.2e} lse err {lerr:.2e} {'ok' if ok else 'FAIL'}",
          flush=True)
    return ok

if __name__ == '__main__':
    which = sys.argv[1] if len(sys.argv) > 1 else 'all'
    ok = True
    cases = {
        'decode_gqa': dict(B=2, H=8, Hkv=2, D=64, Dv=64, lens=[300, 1], Lq=1, page_size=16, splits=1),
        'decode_splits': dict(B=2, H=8, Hkv=2, D=64, Dv=64, lens=[300, 0], Lq=1, page_size=7, splits=3),
        'd128_long': dict(B=1, H=4, Hkv=1, D=128, Dv=128, lens=[520], Lq=1, page_size=0, splits=1),
        'odd_dims': dict(B=1, H=2, Hkv=1, D=40, Dv=24, lens=[150], Lq=1, page_size=16, splits=2),
        'scalar': dict(B=1, H=2, Hkv=1, D=17, Dv=17, lens=[100], Lq=1, page_size=5, splits=1),
        'd256': dict(B=1, H=2, Hkv=1, D=256, Dv=200, lens=[140], Lq=1, page_size=64, splits=1),
        'short_q_causal': dict(B=2, H=6, Hkv=3, D=64, Dv=64, lens=[170, 9], Lq=5, page_size=16, splits=1),
        'window': dict(B=1, H=6, Hkv=3, D=64, Dv=64, lens=[300], Lq=5, page_size=16, splits=2, causal=False, wl=40, wr=2),
        'softcap': dict(B=1, H=4, Hkv=2, D=64, Dv=64, lens=[130], Lq=3, page_size=0, splits=1, softcap=2.5),
        'many_rows': dict(B=1, H=8, Hkv=1, D=64, Dv=64, lens=[90], Lq=5, page_size=16, splits=1, causal=True, wl=20),
        'unaligned': dict(B=1, H=2, Hkv=1, D=64, Dv=64, lens=[70], Lq=1, page_size=0, splits=1, align_pad=3),
        'd256_sm80': dict(B=1, H=2, Hkv=1, D=256, Dv=200, lens=[140], Lq=1, page_size=64, splits=1,
                          max_shared=163 * 1024),
        # several row tiles a block
        'mqa32': dict(B=1, H=32, Hkv=1, D=128, Dv=128, lens=[200], Lq=1, page_size=16, splits=2),
        'mqa24': dict(B=2, H=24, Hkv=1, D=64, Dv=64, lens=[333, 40], Lq=1, page_size=7, splits=3),
        'mqa64': dict(B=1, H=64, Hkv=1, D=128, Dv=96, lens=[150], Lq=1, page_size=0, splits=1),
        'group8_q3': dict(B=1, H=16, Hkv=2, D=64, Dv=64, lens=[260], Lq=3, page_size=16, splits=1),
        'group8_q4': dict(B=1, H=16, Hkv=2, D=128, Dv=128, lens=[180], Lq=4, page_size=7, splits=2),
        'group8_q5': dict(B=2, H=8, Hkv=1, D=64, Dv=64, lens=[290, 3], Lq=5, page_size=7, splits=2),
        'group8_q5_window': dict(B=1, H=16, Hkv=2, D=128, Dv=128, lens=[240], Lq=5, page_size=16, splits=1,
                                 wl=70, wr=0),
        # 40 rows of distinct positions: key slices that end (and start) inside a row tile's
        # positions, so each tile's 'whole' test (its own first and last row) decides
        'chunk_window': dict(B=1, H=2, Hkv=2, D=128, Dv=128, lens=[280], Lq=40, page_size=16, splits=2, wl=120),
        'd256_tiles5': dict(B=1, H=16, Hkv=1, D=256, Dv=256, lens=[130], Lq=5, page_size=16, splits=2),
        # bucket 256 over short queries with a window, splits and pages of 7; Dv > D with softcap
        'd256_window_q3': dict(B=2, H=6, Hkv=2, D=256, Dv=224, lens=[300, 45], Lq=3, page_size=7, splits=3,
                               causal=True, wl=100),
        'd256_softcap_sinkless': dict(B=1, H=8, Hkv=8, D=200, Dv=256, lens=[97], Lq=1, page_size=0, splits=2,
                                      softcap=3.0),
        # 128-key tiles at D 64: splits over pages of 7 and 16, partial tiles at the split ends
        'keys128_pages16': dict(B=2, H=8, Hkv=2, D=64, Dv=64, lens=[700, 129], Lq=1, page_size=16, splits=3),
        'keys128_pages7': dict(B=1, H=4, Hkv=1, D=64, Dv=48, lens=[555], Lq=2, page_size=7, splits=4),
        # the timing tool's variants: 64-key tiles at D 64, a stage count forced
        'keys64_d64': dict(B=1, H=8, Hkv=1, D=64, Dv=64, lens=[333], Lq=4, page_size=16, splits=2, tile_keys=64),
        # D 256's 32-key stages (two row tiles a block), and the timing tool's tile_keys=64 form there
        'keys32_d256': dict(B=2, H=6, Hkv=2, D=256, Dv=224, lens=[300, 45], Lq=3, page_size=7, splits=3,
                            causal=True, wl=100),
        'keys64_d256': dict(B=1, H=4, Hkv=1, D=256, Dv=256, lens=[200], Lq=1, page_size=16, splits=2,
                            tile_keys=64, row_tiles=1),
        'stages5_d128': dict(B=1, H=4, Hkv=1, D=128, Dv=128, lens=[400], Lq=1, page_size=16, splits=1, stages=5),
    }
    for name, kw in cases.items():
        if which != 'all' and which != name: continue
        ok = run(name, order=0, **kw) and ok
        if name in ('decode_splits', 'd128_long', 'mqa24', 'group8_q5', 'stages5_d128'):
            ok = run(name + '_order1', order=1, **kw) and ok
    print('ALL OK' if ok else 'FAILURES')
