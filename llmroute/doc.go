// Package llmroute is the http.handlers.llm_route Caddy module: an
// OpenAI-compatible LLM router.
//
// Where things live (each concern has one home):
//
//   - handler.go   the Handler config (godoc = module docs) and registration
//   - config.go    Provider / Upstream / Model and their validation
//   - duration.go  ISO-8601 + Go durations
//   - provision.go effective settings resolved once; shared state adopted;
//     limits applied on Caddy's "started" event; Cleanup
//   - front.go     the path table: which front (chat, messages,
//     count_tokens, responses, embeddings, completions, models) a path is
//   - serve.go     ServeHTTP: parse → admit → attempt → failover loop, one
//     loop for every generation front (serveFront)
//   - apis.go      the backs: an upstream's native apis, its endpoint URLs
//     (precomputed), the auth header of its key
//   - fronts.go    the one place that decides per attempt native or
//     translated (buildBody), front-shaped errors, the translator stages
//     of the sink chain, client session ids
//   - count_tokens.go  Messages count_tokens: no slot, native or estimated
//   - exchange.go  one attempt's HTTP work and its sink chain:
//     upstream → [think rewriter] → [front translator] → client
//   - wire/anthropic, wire/responses  pure translators Messages ⇄ chat and
//     Responses ⇄ chat (no Caddy, no llmroute import)
//   - attempt.go   one try at one upstream: request build, first-byte
//     watchdog, outcome classification, slot release and metrics
//   - stream.go    the response body: passthrough or think-tag rewrite,
//     idle watchdog, heartbeats, the final SSE error event
//   - state.go     what outlives a reload (UsagePool): slots and backoff
//   - capacity.go  provider capacity (pooled by provider id) and the one
//     claim/release pair every slot goes through (via the upstream's ledger)
//   - ledger.go    one handler's ledger: everything counted or remembered
//     on the request path (claims, releases, backoff and holds, session
//     ids, the fleet views); memory = the pools above, redis = its fleet in
//     front of them. Each handler owns one; every compiled upstream carries
//     it; it wakes the queue through a hook, never by name
//   - fleet.go, stateconfig.go  the `state` block; a redis fleet is pooled
//     by its state block (it outlives a reload that keeps it) and renews,
//     polls and listens for the scopes its handlers registered only
//   - fleetkeys.go  client keys' rates and budgets on the redis fleet
//   - redisstate/  the Redis side, one Lua script per operation (no Caddy,
//     no llmroute import; the request path sees it only through fleet.go)
//   - queue.go     the process-wide FIFO scheduler of waiting requests (slots
//     are pooled by id across handlers and reloads; arrival order is global)
//   - prober.go    background probes of cooling upstreams
//   - metrics.go   collectors registered per config; gauges read from state
//   - errors.go    the OpenAI error shape
//   - registry.go  the handler instances of the running config(s)
//   - status.go    status snapshot and explain verdicts: pure reads of state
//   - admin.go     admin.api.llm_route: /llm_route/status, explain, the page
//     (admin_page.html/.js/.css, embedded)
//   - cli/         `caddy llm-route status|explain`, over the admin API
//   - auth.go      client keys: config, authentication on every
//     front, model lists, refusals, per-key status
//   - budget.go    per-attempt budget reservation and settlement, prices,
//     per-key metrics
//   - keys/        the key state behind a small Store interface (GCRA,
//     budgets; atomic per key) with the embedded memory store; a shared
//     backend implements the same interface
//
// Arrows that never exist: llmroute never imports the caddyfile package;
// packages transform, wire/* and redisstate import nothing of Caddy or of this package; state.go
// holds data and atomics that handlers, the queue and the prober act on, and
// calls out to nothing; nothing reaches a "current" ledger or fleet through
// a global (the ledger is reached through the handler or upstream that owns
// it).
package llmroute
