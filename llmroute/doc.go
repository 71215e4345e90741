// Package llmroute is the http.handlers.llm_route Caddy module: an
// OpenAI-compatible LLM router.
//
// # The parts
//
// The module is a few parts, each with one home. The request path runs
// through them in this order; an arrow goes only from a part to one below
// it, except where the list says otherwise.
//
//  1. Fronts and codecs. front.go maps a path to its front (chat,
//     Messages, count_tokens, Responses, embeddings, completions, models)
//     and the front to its codec. codec.go is the codec interface and
//     codec_<api>.go one codec each: everything one client API does
//     differently (native or translated body, the continuation's chat
//     body, answer and stream translation, how its stream ends, its error
//     shape, its session ids). Nothing outside the codecs branches on the
//     client API, so a new API (Gemini) is a codec file and a wire package.
//     The translators themselves are the pure packages wire/anthropic and
//     wire/responses.
//  2. The route table. route.go holds what a config compiles once at
//     provision: the upstreams with every setting resolved, the models'
//     routes, their per-API and per-size variants (apis.go, context.go),
//     and the pools a model's chain names (place.go): each request ranks
//     a pool step's members once by the pool's placement policy (package
//     placement) and walks route.orderFor, the order in which admission
//     tries the route's targets for that request. Provisioning
//     (provision.go) builds it; nothing on the request path calls back
//     into provisioning.
//  3. Admission. serve.go admits a request on its route: a router model's
//     rule picks the route first (rules.go; the judge, judge.go, when
//     nothing pins the effort; a shadow copy on the side, shadow.go),
//     client keys and budgets (auth.go, budget.go) and the context fit
//     narrow the route,
//     then a slot is claimed in route order through the handler's ledger,
//     or the request waits in the queue (queue.go).
//  4. The ledger (package ledger). Everything counted or remembered:
//     slots, provider capacity, long-context slots, backoff and Retry-After
//     holds, client keys' rates and budgets, session ids, with the memory
//     and Redis backends behind one interface. Each handler owns one, made
//     from its state block (stateconfig.go); every compiled upstream
//     carries it. It is the one part that is a package of its own, because
//     its arrows matter most: the state must never call the queue, the
//     attempts or placement, and across a package boundary the compiler
//     refuses that. It wakes the queue through a hook the handler gives it.
//  5. The attempt path. attempt.go runs one attempt on a claimed slot and
//     records its outcome exactly once (slot, backoff, metric, log);
//     retry.go applies the same-upstream rules (retries, the Retry-After
//     wait and hold) to a run of calls on one slot; call.go is the one way
//     any request reaches an upstream (request, request_timeout, first-byte
//     watchdog and first read, and the sorting of a failed answer in
//     classify.go and context.go), used by attempts, retries,
//     continuations, probes (prober.go) and count_tokens (count_tokens.go),
//     so each rule is written once. exchange.go then carries the answer
//     through the sink chain (upstream → think rewriter → the codec's
//     translator → client writer, stream.go), headers.go filters headers,
//     usage.go reads usage; resume.go continues a broken stream on the next
//     upstream through the same chain.
//
// Beside the path: handler.go (the config and its godoc), config.go,
// duration.go, provision.go and pathcheck.go (the start-up check of each
// provider's URL) set a config up; metrics.go, status.go, admin.go,
// statushandler.go (the same page and answers on a site), history.go (the
// last 15 minutes' rings), routeheaders.go, tracing.go and cli/ show what
// the handler decided and why; keyusage.go keeps keys' usage in Caddy's storage; errors.go holds
// the proxy's own errors; registry.go the running handlers. The pure
// packages transform, wire/*, keys, redisstate, placement (pool placement
// policies and the prefix index; not wired in yet) and internal/jsonscan
// import nothing of Caddy's HTTP code or of this package.
//
// Why the other parts are files and not packages: fronts, the route table,
// admission and the attempt path all work on the same compiled upstream
// and route values and on one exchange, read on the hot path field by
// field. As packages they would export nearly every field of those values
// and pass the exchange across boundaries for no arrow the compiler could
// then enforce that the file split does not already show; the ledger is
// different (a small interface, and an arrow that must never exist).
//
// # The request path
//
//  1. ServeHTTP (serve.go): the path's front and codec (front.go), CORS,
//     the method, the client key (auth.go).
//  2. serveFront (serve.go): read and parse the body, the model's route for
//     the front's API (route.go), the context fit (context.go), the key's
//     rate and budget (budget.go).
//  3. admit (serve.go) → claimFrom in the request's order (queue.go,
//     place.go) →
//     the ledger's claim (ledger/), or wait in the queue (queue.go).
//  4. attempt (attempt.go) → exchangeRetrying (retry.go) → exchange.run
//     (exchange.go): the codec's body (codec_<api>.go), one call
//     (call.go), the sink chain to the client (exchange.go, stream.go).
//  5. finish (attempt.go): the slot back to the ledger, backoff, metrics,
//     the log line; a stream that broke goes to resume (resume.go); a
//     failure before the first byte fails over to the next target in
//     route order (serve.go); when none is left, the refusal in the
//     codec's shape (errors.go, codec.go).
//
// # Arrows that never exist
//
//   - llmroute → the caddyfile package (the core does not know its text);
//   - ledger → this package, the queue, placement or the attempts;
//   - transform, wire/*, keys, redisstate, placement → Caddy's HTTP code
//     or this package;
//   - anything → a process-wide "current" handler, ledger or fleet (state
//     is reached through the handler or upstream that owns it);
//   - the request path → a client API constant outside the codecs (chat,
//     the hub every translation and continuation speaks, excepted).
package llmroute
