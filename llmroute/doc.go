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
//     count_tokens, responses, embeddings, completions, models) a path is,
//     and each front's codec
//   - serve.go     ServeHTTP: parse → admit → attempt → failover loop, one
//     loop for every generation front (serveFront)
//   - apis.go      the backs: an upstream's native apis, its endpoint URLs
//     (precomputed), the auth header of its key
//   - codec.go     the codec interface: what differs per client API, asked
//     by the request path instead of branching on the API, so each API
//     lives in one file and a new one (Gemini) is a codec file and a wire
//     package; the shared parts (translator stages of the sink chain,
//     frontReq, client session ids)
//   - codec_chat.go, codec_messages.go, codec_responses.go,
//     codec_embeddings.go, codec_completions.go  one codec each: native or
//     translated body (encode), the continuation's chat body, answer and
//     stream translation, the native stream's end and error event, the
//     error shape, session ids
//   - count_tokens.go  Messages count_tokens: no slot, native (one call,
//     call.go) or estimated
//   - call.go      the attempt path, the one way any request reaches an
//     upstream: the request, request_timeout, the first-byte watchdog and
//     first read, the sorting of a failed answer (classify.go: failover
//     statuses, Retry-After; context.go: a context-length refusal) and its
//     bounded drain. Attempts, continuations, probes and count_tokens all
//     send through it, so each of those rules is written once
//   - retry.go     the same-upstream rules of a run of calls on a held slot
//     (retries, the Retry-After wait, the hold when the run ends on one),
//     for attempts and continuations alike (tryAgain)
//   - exchange.go  one attempt's exchange: the front's body sent as a call,
//     then the sink chain: upstream → [think rewriter] → [front translator]
//     → client
//   - resume.go    mid-stream continuation: the follower, continuation calls
//     copied through the first exchange's chain
//   - wire/anthropic, wire/responses  pure translators Messages ⇄ chat and
//     Responses ⇄ chat (no Caddy, no llmroute import)
//   - attempt.go   one attempt on one upstream's slot: its outcome recorded
//     exactly once (slot release, backoff, metric, log); the watchdog and
//     the first-read decision the calls use
//   - stream.go    the response body: passthrough or think-tag rewrite,
//     idle watchdog, heartbeats, the final SSE error event (in the shape
//     the codec gives, streamShape)
//   - ledger/      package ledger: everything counted or remembered on the
//     request path behind one interface (slot, capacity and long-context
//     claims, backoff and holds, client keys' rates and budgets, session
//     ids, the fleet views) and the pooled state it counts in (what
//     outlives a reload). memory = the pools, redis = a fleet (pooled by
//     its state block) in front of them. Each handler owns one; every
//     compiled upstream embeds its handle (ledger.Upstream) and carries
//     the ledger; it wakes the queue through a hook, never by name
//   - stateconfig.go  the `state` block (StateConfig), resolved into the
//     ledger's plain options
//   - redisstate/  the Redis side, one Lua script per operation (no Caddy,
//     no llmroute import; the request path sees it only through the
//     ledger's fleet)
//   - queue.go     the process-wide FIFO scheduler of waiting requests (slots
//     are pooled by id across handlers and reloads; arrival order is global)
//   - prober.go    background probes of cooling upstreams (one call each,
//     quiet: a probe's failure changes nothing)
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
// packages transform, wire/* and redisstate import nothing of Caddy or of this package; ledger/
// imports neither this package nor Caddy's HTTP handler code, so the state
// it holds never calls the queue, placement or the attempts (the compiler
// refuses the import); nothing reaches a "current" ledger or fleet through
// a global (the ledger is reached through the handler or upstream that owns
// it).
package llmroute
