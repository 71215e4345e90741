// Package placement is the pure policy that orders a pool's members for
// one request: given each member's load view (in-flight, limit, cooling,
// weight) and the request's features (an affinity key's hash, the chain of
// block hashes of its prompt), it fills a ranking of the members with a
// reason for each position. It also holds the cache_aware pieces: the
// chain hashing of a prompt and the per-pool approximate prefix index with
// its affinity pins.
//
// The arrows it never has: it imports only the standard library — not
// Caddy, not the llmroute core, not the ledger, no wire format. The caller
// copies the ledger's atomics into a []Member it owns; placement never
// reads or claims a slot, never waits and never logs. Admission walks the
// order it returns and skips what it cannot claim; waiting for a busy warm
// member (affinity_wait) is the queue's job, told by Decision. It is not
// wired into the handler yet: pools, their config and the route table's
// order come later.
//
// Choices, with their reasons:
//
//   - Allocation-free use: Rank fills an order and a reasons slice the
//     caller owns, and Chain appends into a caller buffer, so a decision
//     of any policy costs no allocation for pools of up to 64 members
//     (the request path already allocates enough).
//   - Every policy puts the members that can be claimed now first (in the
//     policy's order), then the busy ones, then the cooling ones, so
//     order[0] is the member to try and a busy or cooling first choice
//     hands to the next-ranked without the caller re-sorting.
//   - least_busy: load is in-flight ÷ limit (in-flight alone without a
//     limit); ties go round-robin from a per-pool atomic counter, so idle
//     equal members alternate instead of the first taking everything.
//   - sticky: weighted rendezvous hashing, score = -weight / ln(u), u a
//     splitmix64-mixed hash of (key hash, member id hash) mapped into
//     (0,1). A key's ranking depends only on the members present, so
//     removing a member moves only the keys it held and adding one takes
//     only its weighted share; all members are ranked, so a busy first
//     choice falls to the key's own second choice, not to a shared one.
//   - Member ids are hashed with FNV-1a 64 plus the splitmix64 finaliser
//     (HashString): stable across processes and restarts, which a shared
//     pin (state redis) and a reload need; keys are short, so speed does
//     not matter there.
//   - Prompt blocks are BlockSize = 256 bytes (about 64 tokens at ~4 bytes
//     a token): near the KV-cache page sizes engines reuse in (vLLM 16
//     tokens, SGLang 1 token, llama.cpp whole prefix) but coarse enough
//     that a 100 K-token prompt is ~1,600 blocks, not tens of thousands of
//     index entries. A trailing partial block is not hashed: it is the
//     part that changes next turn, and it is under 64 tokens.
//   - Block hashing uses hash/maphash (AES-based on amd64 and arm64;
//     12–17 GB/s measured on a 2-core machine against ~1 GB/s for
//     byte-at-a-time FNV-1a), so a 100 K-token prompt (~400 KB) hashes
//     in ~24–33 µs where FNV-1a would take ~400 µs. One seed per process:
//     the index is each process's own, so hashes need not agree across
//     processes. Each block's hash is chained with the previous one
//     through the splitmix64 finaliser, so
//     a shared prefix is a shared chain and equal blocks at different
//     positions or after different histories differ.
//   - The index keeps, per member, the chain hashes it was sent, up to a
//     capacity in blocks (least recently used out first) and aged by a
//     TTL. Record touches a chain from its last block to its first, so a
//     prefix is always at least as recent as what follows it: eviction
//     and ageing remove suffixes first, which keeps "a member that holds
//     block i holds blocks 0…i-1" true and lets a longest-prefix lookup be
//     a binary search (about log2(blocks) map probes per member).
//   - Ties of the longest prefix: Longest takes the lower member index;
//     Rank, which has the load views, takes the least busy of the tied
//     members (then the lower index), since both hold the prefix.
//   - Correct drops, from the member, the request's chain from the block
//     where the reported reuse ends (cached tokens scaled to blocks by the
//     prompt's tokens per block, rounded up so a partly reused block
//     stays) to the chain's end, and only when that is before the prefix
//     the index predicted: the engine evidently does not keep what it is
//     sent, so the member should look cold for it. Another conversation's
//     blocks that chained through the dropped ones stay until they age or
//     are evicted; the lookup's binary search may then over-estimate that
//     conversation's prefix on this member once, and its own correction
//     follows.
//   - One mutex per index (per pool): a lookup holds it for its probes only
//     (~0.15 µs for a 100 K-token prompt on three members), a Record for
//     one map update per block (~30 µs for 100 K tokens, done after the
//     request is sent, off the decision); an uncontended lock costs ~20 ns.
//   - Memory: a block costs a 24-byte slot plus its map entry, ~65 bytes in
//     all, so a member at DefaultCapacity (16 Ki blocks) takes ~1.06 MB
//     (BenchmarkIndexBytesPerMember); slots grow as blocks arrive, so an
//     idle member costs almost nothing. Pins are ~40 bytes each, at most
//     DefaultPins (64 Ki, ~2.6 MB) per pool.
package placement
