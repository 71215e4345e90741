// Package ledger is everything the llm_route handler counts or remembers
// on the request path, behind one interface (Ledger): upstream slots and
// provider capacity, long-context slots, backoff, cooling and Retry-After
// holds, client keys' rates and budget reservations, and session ids.
// Each handler owns one ledger, made from its `state` block: memory (this
// process's pooled state) or redis (a fleet, pooled by its state block, in
// front of the same pooled state).
//
// What it holds:
//
//   - state.go     the pooled per-upstream state (slots, limit, cooling,
//     fail streak, last failure and probe) and backoff scopes; the
//     per-upstream handle (Upstream) the core's compiled upstream embeds;
//     the pool references a handler holds (PoolRefs)
//   - capacity.go  provider capacity and the local claim/release pair
//   - longctx.go   long-context slots per provider
//   - ledger.go    the Ledger interface, the memory and the redis ledger
//   - fleet.go     the redis fleet: claims, renewals, the wake listener,
//     the poll, shared backoff
//   - fleetkeys.go client keys' rates and budgets on the fleet, with this
//     process's key store as its fallback
//   - sessions.go  the session registry, local or shared in Redis
//
// The arrows it never has: it imports neither the llmroute core nor
// Caddy's HTTP handler code, so it cannot name the queue, placement, the
// attempts or a request. The queue is woken through the hook its handler
// gives (wake), and the scheduler asks the ledger through the interface
// (Pin, Finish, Unpin). That is why it is a package of its own and not
// files of the core: inside one package nothing stops the state from
// calling back into the request path; across packages the compiler
// refuses it (the import would be a cycle).
//
// What stays process-wide here, and why: the pools of state keyed by id
// (upstreams, providers, backoff scopes, long-context slots) and the
// states parked while a removed upstream's requests drain, because a
// reload's new config must count in the very counters the old config's
// requests release into; the fleets, pooled by state block, so a reload
// that keeps the block keeps its client and background work; the key
// store (LocalKeys) and the session registry, so a reload keeps every
// key's accounts and every conversation's id; and this process's name in
// Redis (instanceID) and the count of failed Redis calls.
package ledger
