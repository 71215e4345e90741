package llmroute

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/url"
	"sort"
	"strings"
	"time"

	"github.com/llm-route/caddy-llm-route/llmroute/placement"
)

// Provider is a backend that speaks the OpenAI chat completions API: a base
// URL and a key. Upstreams reference it by ID.
type Provider struct {
	// ID names the provider inside this config; upstreams reference it. Unique
	// among providers. Backoff state shared by the whole provider is keyed by
	// it process-wide, so the same ID in two llm_route handlers (or across a
	// reload) means the same provider.
	ID string `json:"id"`

	// URL is the base URL, e.g. `https://api.openai.com/v1`. Requests go to
	// URL + `/chat/completions`. Must be an absolute http or https URL.
	URL string `json:"url"`

	// Key is sent as `Authorization: Bearer <key>`; empty sends no
	// Authorization header at all. Placeholders are resolved once at
	// provision time: `{env.NAME}`, `{file./path}` and the original proxy's
	// `${NAME}`. Prefer placeholders: a literal key is visible in Caddy's
	// `GET /config/`. The key never appears in a log, an error or a metric.
	Key string `json:"key,omitempty"`

	// Keys is a pool of keys used instead of Key (setting both is an
	// error), numbered from 0 in list order; each resolves placeholders as
	// Key does. Every attempt takes one key that is not cooling, as
	// KeyRotation says; a key the provider refuses cools by why it was
	// refused (KeyCooldownAuth, KeyCooldownQuota, KeyCooldownRate) and the
	// request is sent again at once with another key. Only when every key
	// cools does the attempt count as a failure of the upstream, which
	// then cools until the first key comes back. Logs, metrics and the
	// status name a key by its index and a short hash, never the key.
	// Default: none (Key alone).
	Keys []string `json:"keys,omitempty"`

	// KeyRotation is how an attempt picks among Keys that are not
	// cooling: `random` (default: an even spread), `round_robin` (in
	// turn) or `least_used` (the key with the fewest requests so far, so a
	// key that comes back after a cooldown catches up).
	KeyRotation string `json:"key_rotation,omitempty"`

	// KeyCooldownAuth is how long a key of Keys is left out after the
	// provider refused it (401 or 403). Default 24h.
	KeyCooldownAuth *Duration `json:"key_cooldown_auth,omitempty"`

	// KeyCooldownQuota is how long a key of Keys is left out after a
	// quota or billing refusal: a 402, or an error body that says
	// `insufficient_quota`, a billing error or a credit balance too low
	// (OpenAI, Anthropic, OpenRouter). Default 1h.
	KeyCooldownQuota *Duration `json:"key_cooldown_quota,omitempty"`

	// KeyCooldownRate is how long a key of Keys is left out after a 429
	// that is not about quota and has no Retry-After (a Retry-After is
	// used instead, up to the handler's retry_after_max). Default 1m.
	KeyCooldownRate *Duration `json:"key_cooldown_rate,omitempty"`

	// ClientKeyHeader names a request header (e.g. `X-Provider-Key`)
	// whose value, when a request carries it, is this provider's key for
	// that request (sent in the provider's Auth header) instead of Key or
	// Keys: the caller brings its own key. The router never logs, stores
	// or cools it, and the header never goes upstream: other providers of
	// the chain get their own key. Caddy's access log copies the request
	// before any handler runs: filter the header out there
	// (docs/key-pools.md). Default: none.
	ClientKeyHeader string `json:"client_key_header,omitempty"`

	// MaxConcurrency is the default slot limit of this provider's upstreams
	// (in-flight requests per upstream). 0 or absent means unlimited unless
	// the upstream sets its own.
	MaxConcurrency int `json:"max_concurrency,omitempty"`

	// Capacity bounds the in-flight requests over all of this provider's
	// upstreams and models together, on top of each upstream's
	// own limit: two models on one local GPU share it. A request claims its
	// upstream slot and a unit of capacity together; none free means the
	// next upstream or the queue. 0 or absent means no bound.
	Capacity int `json:"capacity,omitempty"`

	// Patch is a JSON object deep-merged into every request body sent through
	// this provider (first of the three patch layers).
	Patch json.RawMessage `json:"patch,omitempty"`

	// Headers are static request headers added to every request sent to this
	// provider, e.g. `HTTP-Referer` and `X-Title` for OpenRouter. They cannot
	// replace Authorization (use Key).
	Headers map[string]string `json:"headers,omitempty"`

	// ForwardHeaders names client request headers that reach this
	// provider as well as the built-in allow-list (content negotiation,
	// User-Agent, OpenAI-Beta, anthropic-version/-beta, x-stainless-*), e.g.
	// `X-Request-Id` or `traceparent`. Every other client header stays
	// behind. Default: none.
	ForwardHeaders []string `json:"forward_headers,omitempty"`

	// SessionHeader, if set, names a request header that the proxy always sets
	// (overwriting the client's value) to a session id computed from the
	// message history, for APIs that want a stable session id
	// (e.g. `x-opencode-session`).
	SessionHeader string `json:"session_header,omitempty"`

	// ThinkTags is the default think-tag handling of this provider's
	// upstreams: `off` (default: responses untouched, byte for byte),
	// `split` (`<think>…</think>` moved from `content` to
	// `reasoning_content`) or `strip` (cut and dropped). `true` means split,
	// `false` means off; an unknown word means off with a warning.
	ThinkTags ThinkTags `json:"think_tags,omitempty"`

	// ReasoningField, if set (e.g. `reasoning_content`), is backfilled in
	// every assistant message of the outgoing history that lacks a non-empty
	// value, from `reasoning` or the text of `reasoning_details`.
	ReasoningField string `json:"reasoning_field,omitempty"`

	// ReasoningEmptyOK writes `""` into ReasoningField when an assistant
	// message has no reasoning text at all. Default false (no field).
	ReasoningEmptyOK bool `json:"reasoning_empty_ok,omitempty"`

	// APIs are the wire APIs this provider's upstreams serve natively,
	// from `chat`, `messages`, `responses`, `embeddings`, `completions`
	// and `gemini` (Google's Gemini API, `generateContent`; the provider
	// url is then the API root such as
	// `https://generativelanguage.googleapis.com/v1beta`, to which
	// `/models/{model}:generateContent` is appended). Default `["chat"]`.
	// A Messages, Responses or Gemini request to an upstream without its
	// API is translated to chat; an embeddings or completions request
	// skips such an upstream.
	APIs []string `json:"apis,omitempty"`

	// Auth is the header the provider's key goes in: `bearer` (default,
	// `Authorization: Bearer <key>`), `x-api-key` (Anthropic), `api-key`
	// (Azure) or `x-goog-api-key` (Google).
	Auth string `json:"auth,omitempty"`

	// KeepBillingHeader keeps Claude Code's `x-anthropic-billing-header:`
	// first system block in Messages requests to this provider. Default
	// false: it is removed, since it changes on every request and defeats
	// prefix caches.
	KeepBillingHeader bool `json:"keep_billing_header,omitempty"`

	// Backoff is the cap of the exponential backoff (1s, 2s, 4s, … up to the
	// cap) with ONE failure counter shared by all upstreams of this provider
	// that do not set their own backoff. Absent means no provider backoff.
	Backoff *Duration `json:"backoff,omitempty"`

	// FirstByteTimeout is how long a streaming request may wait for the first
	// byte of the response, counted from the moment the request is sent;
	// after that the attempt fails over. Default 30s; 0 disables.
	FirstByteTimeout *Duration `json:"first_byte_timeout,omitempty"`

	// StreamIdleTimeout is how long a stream may stay silent after its first
	// byte before the attempt counts as failed. Default 30s (a
	// stalled stream is cut, and another upstream can answer, in half a
	// minute); 0 disables.
	StreamIdleTimeout *Duration `json:"stream_idle_timeout,omitempty"`

	// ProbeInterval is the period of the background probe of this provider's
	// cooling upstreams. Default 1s; 0 disables probing (an upstream then
	// comes back only when its backoff ends).
	ProbeInterval *Duration `json:"probe_interval,omitempty"`

	// Retries is how many times a 5xx answer or a connection error, before
	// the first byte, is retried on the same upstream (holding its slot,
	// after a jittered pause of 0.25–0.75s) before the attempt counts as a
	// failure and fails over. A first-byte timeout is never retried.
	// Default 0: fail over at once.
	Retries int `json:"retries,omitempty"`

	// RetryAfterWait is the longest `Retry-After` (of a 429 or 503) that
	// is waited out in place and retried on the same upstream, once per
	// attempt, if request_timeout leaves room for it; a longer one cools
	// the upstream and fails over at once. Default 0: never wait.
	RetryAfterWait *Duration `json:"retry_after_wait,omitempty"`

	// LongContextCapacity bounds how many long-context requests (estimated
	// above the handler's long_context_threshold) the provider's upstreams
	// serve at once; such a request holds one of these slots as well as a
	// normal one. Default 0: no bound.
	LongContextCapacity int `json:"long_context_capacity,omitempty"`

	// TransportRaw configures how the provider is reached, as Caddy's
	// `reverse_proxy` does: `{"protocol": "http", …}` is the
	// `http.reverse_proxy.transport.http` module with all its options (TLS
	// trust pools and client certificates, `tls_insecure_skip_verify`, dial
	// and response-header timeouts, keep-alive, forward proxies, HTTP
	// versions). Absent (the default): a transport tuned for LLM traffic
	// (10s dial and TLS handshake timeouts, 30s TCP keep-alive, up to 1024
	// idle connections per host kept 2m, HTTP/2 when offered, the system's
	// CAs, `HTTPS_PROXY`/`HTTP_PROXY`/`NO_PROXY` from the environment).
	TransportRaw json.RawMessage `json:"transport,omitempty" caddy:"namespace=http.reverse_proxy.transport inline_key=protocol"`
}

// Upstream is a real model at a provider, with its own slot limit. Models
// reference it by ID.
type Upstream struct {
	// ID names the upstream inside this config; models reference it. Unique
	// among upstreams. Slot counters and the upstream's own backoff are keyed
	// by it process-wide: the same ID in two llm_route handlers, or before and
	// after a reload, shares one set of slots.
	ID string `json:"id"`

	// Provider is the ID of the provider that serves this upstream.
	Provider string `json:"provider"`

	// Model is the model name the provider knows; it replaces the client's
	// `model` in the request body.
	Model string `json:"model"`

	// MaxConcurrency is the slot limit of this upstream; it overrides the
	// provider's. 0 or absent inherits the provider's; none anywhere means
	// unlimited.
	MaxConcurrency int `json:"max_concurrency,omitempty"`

	// Patch is deep-merged into the request body after the provider's patch.
	Patch json.RawMessage `json:"patch,omitempty"`

	// ThinkTags overrides the provider's think-tag handling for this upstream.
	ThinkTags ThinkTags `json:"think_tags,omitempty"`

	// APIs overrides the provider's apis for this upstream. Default: the
	// provider's.
	APIs []string `json:"apis,omitempty"`

	// Backoff gives this upstream its own failure counter with this cap; the
	// provider's backoff then does not apply to it.
	Backoff *Duration `json:"backoff,omitempty"`

	// FirstByteTimeout overrides the provider's first-byte window.
	FirstByteTimeout *Duration `json:"first_byte_timeout,omitempty"`

	// StreamIdleTimeout overrides the provider's stream idle timeout.
	StreamIdleTimeout *Duration `json:"stream_idle_timeout,omitempty"`

	// ProbeInterval overrides the provider's probe period.
	ProbeInterval *Duration `json:"probe_interval,omitempty"`

	// PriceInput is what this upstream charges per million input tokens,
	// in USD, for client keys' spend budgets. Default 0 (free).
	PriceInput float64 `json:"price_input,omitempty"`
	// PriceOutput is the USD price per million output tokens. Default 0.
	PriceOutput float64 `json:"price_output,omitempty"`
	// PriceCachedInput is the USD price per million cached input tokens.
	// Default: price_input (no cache discount).
	PriceCachedInput float64 `json:"price_cached_input,omitempty"`
	// Retries overrides the provider's retries.
	Retries *int `json:"retries,omitempty"`

	// RetryAfterWait overrides the provider's retry_after_wait.
	RetryAfterWait *Duration `json:"retry_after_wait,omitempty"`

	// ContextWindow is the upstream's context window in tokens: a request
	// whose estimated prompt tokens plus its max_tokens exceed it skips
	// this upstream. Default 0: no check.
	ContextWindow int `json:"context_window,omitempty"`
	// Prefill says whether this upstream continues an assistant message
	// sent as the last message of the request (assistant prefill), which a
	// mid-stream continuation (model `resume`) relies on; false makes the
	// continuation replay the request and match the regenerated text
	// instead. Default: true.
	Prefill *bool `json:"prefill,omitempty"`
}

// Pool is a set of equivalent upstreams (the same real model on several
// GPUs, accounts or regions) that a model names as one step of its chain;
// its placement policy orders the members for each request.
type Pool struct {
	// ID names the pool; models name it in their upstreams. Unique among
	// pools and upstreams.
	ID string `json:"id"`

	// Upstreams are the member upstream IDs, one or more. An upstream may
	// belong to several pools and be named by models directly too; its
	// slots and backoff are one.
	Upstreams []string `json:"upstreams"`

	// Placement orders the members for a request: "first" (list order),
	// "least_busy" (ascending in-flight ÷ limit, idle equals in turn),
	// "sticky" (weighted rendezvous hashing of the affinity key) or
	// "cache_aware". Default: "least_busy".
	Placement string `json:"placement,omitempty"`

	// Weights are positive integers aligned with Upstreams, used by sticky:
	// [90, 10] sends 90 % of the keys to the first member. Default: all 1.
	Weights []int `json:"weights,omitempty"`

	// AffinityKey is a placeholder expression (e.g.
	// `{http.request.header.X-User-Id}`) whose value, when non-empty, is the
	// request's affinity key before the client's session headers. Default:
	// none.
	AffinityKey string `json:"affinity_key,omitempty"`

	// AffinityWait is how long a request waits for its pinned or warm
	// member when that member is busy. Default 0: no wait.
	AffinityWait *Duration `json:"affinity_wait,omitempty"`

	// AffinityTTL is how long an affinity key's pin and the prompt index
	// entries live. Default 1h.
	AffinityTTL *Duration `json:"affinity_ttl,omitempty"`

	// CacheThreshold (0–1) is the share of the prompt a member's index must
	// hold for cache_aware to prefer it. Default 0.5.
	CacheThreshold *float64 `json:"cache_threshold,omitempty"`
}

// Model is what clients ask for: a name and an ordered list of upstreams,
// or, for a router model, rules that pick a chain of other models.
type Model struct {
	// Name is what the client sends as `model`. Unique among models. A
	// client may ask for a router model with an effort suffix,
	// `<name>:low`, `<name>:medium` or `<name>:high`.
	Name string `json:"name"`

	// Upstreams are upstream or pool IDs in priority order: a request goes
	// to the first one that is not cooling and has a free slot; a pool's
	// members are tried in its placement order for the request. A plain
	// model needs at least one; a router model has none (it has Rules).
	Upstreams []string `json:"upstreams,omitempty"`

	// Rules make the model a router model: each request goes to the chain
	// of the matching rule with the highest priority (ties: the first
	// listed). For each of the efforts low, medium and high, some rule
	// without `match` must cover it, so that every request finds one.
	// Default: none (a plain model, served by Upstreams).
	Rules []Rule `json:"rules,omitempty"`

	// Judge asks a model to guess the effort of a request that pins none
	// (EXPERIMENTAL). Default: none, and such a request is medium.
	Judge *Judge `json:"judge,omitempty"`

	// Patch is deep-merged into the request body last (highest priority).
	Patch json.RawMessage `json:"patch,omitempty"`

	// QueueSize overrides the handler's queue_size for this model; an
	// explicit 0 turns the queue off for this model.
	QueueSize *int `json:"queue_size,omitempty"`

	// QueueTimeout overrides the handler's queue_timeout for this model.
	QueueTimeout *Duration `json:"queue_timeout,omitempty"`

	// Resume, "on", continues a chat stream that breaks after bytes reached
	// the client (cut, stall, request timeout) on the next free upstream of
	// the model, so the client sees one stream. Default: "off".
	Resume string `json:"resume,omitempty"`

	// RepeatGuard, "on", watches the answer's text (content and reasoning,
	// each on its own; never tool-call arguments) for a loop: the text so
	// far ends with at least three back-to-back copies of one unit of 1 to
	// RepeatMaxPeriod runes, covering at least RepeatMinSpan runes. Text
	// that is not inside a growing run reaches the client at once; a run's
	// text is held back until it breaks (then released as it was) or is
	// confirmed. A confirmed loop is dropped and the answer continued on the
	// next free upstream of the model (else the same one) from the text
	// delivered, with temperature raised by 0.3 (from the request's, default
	// 0.7, at most 1.5) and frequency_penalty 0.5 unless the request sets
	// one; with no recovery left the answer ends there with finish reason
	// `length`. Default: "off".
	RepeatGuard string `json:"repeat_guard,omitempty"`

	// RepeatMinSpan is the shortest loop, in runes, that the repeat guard
	// confirms; it is also the most it holds back. At least 16. Default:
	// 400.
	RepeatMinSpan int `json:"repeat_min_span,omitempty"`

	// RepeatMaxPeriod is the longest unit, in runes, that the repeat guard
	// looks for: 1 to 256, and at most half of RepeatMinSpan, so that two
	// copies (the most the client sees before the text is held) fit in the
	// span. Default: 200, or half of RepeatMinSpan when that is smaller.
	RepeatMaxPeriod int `json:"repeat_max_period,omitempty"`

	// RepeatRecoveries is how many times per request the repeat guard
	// continues an answer after a loop, 0 to 3; 0 ends the answer at the
	// first loop. Default: 1.
	RepeatRecoveries *int `json:"repeat_recoveries,omitempty"`
}

// Rule is one rule of a router model: which requests it takes (effort and
// attributes) and the chain of models that serves them.
type Rule struct {
	// Name names the rule in headers, logs and metrics. Required, unique
	// in the model.
	Name string `json:"name"`

	// Priority orders the rules: of the rules that match a request, the
	// one with the highest priority wins, and of equal ones the first
	// listed. Default 0.
	Priority int `json:"priority,omitempty"`

	// Effort is the request effort the rule takes: `low`, `medium` or
	// `high`. Default: any effort.
	Effort string `json:"effort,omitempty"`

	// Match maps an attribute name (lower-case) to the value, or list of
	// values, it must equal; every attribute listed must match. An absent
	// attribute never matches. Attributes come from the body's `metadata`
	// (string values), `user` (Messages: `metadata.user_id`), request
	// headers `X-LLM-Attr-<Name>`, and, set by the router only, `key` (the
	// client key id) and the client key's labels. Default: none, every
	// request (a catch-all for the rule's effort).
	Match map[string]StringList `json:"match,omitempty"`

	// Use are the names of plain models, in order: the first serves the
	// request, the others are its fallbacks (each with its own upstreams,
	// pools and patches). At least one.
	Use []string `json:"use"`

	// Weights, one per model of Use, make the choice of the first model a
	// weighted one, sticky per request `user` attribute (else client key,
	// else affinity key): [90, 10] sends 10 % of users to the second
	// model first. The rest of Use, in order, stays the fallback chain.
	// Weight 0 is never chosen first. Default: none, Use's order.
	Weights []int `json:"weights,omitempty"`

	// Shadow also sends a fraction of the rule's requests to another
	// model, whose answer is discarded. Default: none.
	Shadow *Shadow `json:"shadow,omitempty"`
}

// StringList is one string or a list of strings. It decodes both and
// encodes a single value as a plain string.
type StringList []string

// UnmarshalJSON accepts a string or an array of strings.
func (l *StringList) UnmarshalJSON(b []byte) error {
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		*l = StringList{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return fmt.Errorf("want a string or a list of strings, got %s", b)
	}
	*l = many
	return nil
}

// MarshalJSON writes a single value as a string, else a list.
func (l StringList) MarshalJSON() ([]byte, error) {
	if len(l) == 1 {
		return json.Marshal(l[0])
	}
	return json.Marshal([]string(l))
}

// Shadow duplicates a share of a rule's requests to a candidate model, to
// compare it with the answers clients get. The copy runs on the side and
// its answer is read and discarded: it never delays or changes the
// client's answer, never queues, retries or fails over (it goes to the
// first upstream of the model with a slot free at once, and only while no
// client waits for a slot; otherwise it is not sent), and never counts
// against the client's key (rate, tokens, spend) or an upstream's backoff.
// At most 16 copies run at once per handler (more are not sent); each is
// bounded by request_timeout (5m when that is off) and cancelled by a
// reload or stop. Each copy is counted in
// llm_proxy_shadow_requests_total{model,result} (model: the shadow model),
// its tokens in llm_proxy_tokens_total, and each copy sent writes one
// "shadow compared" log line with both answers' status, result, tokens,
// latency and time to first token (never a body).
type Shadow struct {
	// Model is the plain model the copies go to. Required.
	Model string `json:"model"`

	// Fraction (0 to 1) is the share of the rule's requests copied,
	// counted over the requests the rule admits, not drawn at random:
	// 0.25 copies exactly one in four. Default 0: none.
	Fraction float64 `json:"fraction,omitempty"`
}

// Judge is the model asked for the effort of a request that pins none
// (EXPERIMENTAL: its question and the way its answer is read may change).
// It is asked only when neither the name's suffix nor a body field gives
// an effort, with the request's last user message (its first 4 KiB) and a
// fixed question; an answer of exactly low, medium or high (case, white
// space and a final period ignored) within the deadline is the effort,
// anything else leaves the request at medium. It takes a slot of the
// judge model's upstreams only when one is free at once and no request
// waits in a queue (else it is not asked), is sent once, and never puts
// an upstream into backoff. The request goes on in every case.
type Judge struct {
	// Model is the plain model asked; it needs an upstream that serves
	// chat. Required; no default.
	Model string `json:"model"`

	// Deadline bounds the judge's answer, and so the latency it adds to a
	// request: a later answer counts as none (medium). From 1ms to 10s.
	// Default 250ms.
	Deadline *Duration `json:"deadline,omitempty"`
}

// ThinkTags is a think_tags setting. It accepts a JSON string or a boolean
// (true = split, false = off), as the original config did.
type ThinkTags string

// UnmarshalJSON accepts a string or a boolean.
func (t *ThinkTags) UnmarshalJSON(b []byte) error {
	switch string(b) {
	case "true":
		*t = "split"
		return nil
	case "false":
		*t = "off"
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("think_tags: want off, split, strip, true or false, got %s", b)
	}
	*t = ThinkTags(s)
	return nil
}

// UnmarshalJSON decodes the handler config strictly, as Caddy decodes every
// module (an unknown field is an error). When that fails, it names the entry
// and the field, e.g. `upstreams[2] "gpu": first_byte_timeout: invalid
// duration "3x"`, instead of the bare message of the value's decoder: the
// admin API's /load answers with it.
func (h *Handler) UnmarshalJSON(b []byte) error {
	type plain Handler // the same fields, without this method
	if err := decodeStrictly(b, (*plain)(h)); err != nil {
		return locateDecodeError(b, err, func() any { return new(plain) })
	}
	h.loadedFrom = bytes.Clone(b)
	return nil
}

func decodeStrictly(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

// configLists are the handler's lists of entries, each decoded on its own
// to find the entry that failed.
var configLists = []struct {
	key      string
	newEntry func() any
}{
	{"providers", func() any { return new(Provider) }},
	{"upstreams", func() any { return new(Upstream) }},
	{"models", func() any { return new(Model) }},
	{"keys", func() any { return new(ClientKey) }},
}

// locateDecodeError finds where the handler config b failed to decode with
// err: the first entry of a list that fails on its own, else the first
// handler field. It returns err itself when b is not even a JSON object.
// This runs only for a config that does not load.
func locateDecodeError(b []byte, err error, newHandler func() any) error {
	var top map[string]json.RawMessage
	if json.Unmarshal(b, &top) != nil {
		return err
	}
	for _, list := range configLists {
		var entries []json.RawMessage
		if json.Unmarshal(top[list.key], &entries) != nil {
			continue // not a list: the handler-level pass below says so
		}
		for i, e := range entries {
			if ferr := locateField(e, list.newEntry); ferr != nil {
				return fmt.Errorf("%s[%d]%s: %v", list.key, i, entryName(e), ferr)
			}
		}
	}
	if ferr := locateField(b, newHandler); ferr != nil {
		return ferr
	}
	return err
}

// locateField decodes each field of the JSON object obj alone into a fresh
// value and returns the first failure as "<field>: <reason>".
func locateField(obj json.RawMessage, newValue func() any) error {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(obj, &fields); err != nil {
		return errors.New("must be a JSON object")
	}
	names := make([]string, 0, len(fields))
	for name := range fields {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		one, _ := json.Marshal(map[string]json.RawMessage{name: fields[name]})
		err := decodeStrictly(one, newValue())
		if err == nil {
			continue
		}
		if strings.HasPrefix(err.Error(), "json: unknown field ") {
			return fmt.Errorf("unknown field %q", name)
		}
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return fmt.Errorf("%s: want %v, got %s", name, te.Type, te.Value)
		}
		return fmt.Errorf("%s: %v", name, err)
	}
	return nil
}

// entryName renders the id (or name) of a list entry for an error, ` "gpu"`,
// or "" when it has none.
func entryName(e json.RawMessage) string {
	var named struct {
		ID   any `json:"id"`
		Name any `json:"name"`
	}
	_ = json.Unmarshal(e, &named)
	for _, v := range []any{named.ID, named.Name} {
		if s, ok := v.(string); ok && s != "" {
			return fmt.Sprintf(" %q", s)
		}
	}
	return ""
}

// validate checks ids, references and values, and names the offending entry
// in every message. It does not resolve anything.
func validateConfig(providers []Provider, upstreams []Upstream, pools []Pool, models []Model) error {
	var errs []string
	bad := func(format string, args ...any) { errs = append(errs, fmt.Sprintf(format, args...)) }

	providerIDs := make(map[string]bool, len(providers))
	for i, p := range providers {
		where := namedEntry(bad, providerIDs, "provider", i, "id", p.ID)
		if err := checkBaseURL(p.URL); err != nil {
			bad("%s: url: %v", where, err)
		}
		if p.Capacity < 0 {
			bad("%s: capacity must not be negative (0 = none)", where)
		}
		if p.MaxConcurrency < 0 {
			bad("%s: max_concurrency must not be negative (0 = unlimited)", where)
		}
		if p.Retries < 0 || p.LongContextCapacity < 0 {
			bad("%s: retries and long_context_capacity must not be negative", where)
		}
		if err := checkPatch(p.Patch); err != nil {
			bad("%s: patch: %v", where, err)
		}
		for name := range p.Headers {
			if err := checkStaticHeader(name); err != nil {
				bad("%s: headers: %v", where, err)
			}
		}
		if p.SessionHeader != "" && !validHeaderName(p.SessionHeader) {
			bad("%s: session_header %q is not a valid header name", where, p.SessionHeader)
		}
		if _, err := parseAPIs(p.APIs); err != nil {
			bad("%s: apis: %v", where, err)
		}
		if _, ok := authHeaders[p.Auth]; !ok {
			bad("%s: auth: %q is not bearer, x-api-key, api-key or x-goog-api-key", where, p.Auth)
		}
		checkKeyPool(bad, where, &p)
	}

	upstreamIDs := make(map[string]bool, len(upstreams))
	for i, u := range upstreams {
		where := namedEntry(bad, upstreamIDs, "upstream", i, "id", u.ID)
		switch {
		case u.Provider == "":
			bad("%s: provider is required", where)
		case !providerIDs[u.Provider]:
			bad("%s: unknown provider %q", where, u.Provider)
		}
		if u.Model == "" {
			bad("%s: model is required", where)
		}
		if _, err := parseAPIs(u.APIs); err != nil {
			bad("%s: apis: %v", where, err)
		}
		if u.MaxConcurrency < 0 {
			bad("%s: max_concurrency must not be negative (0 = inherit)", where)
		}
		if u.Retries != nil && *u.Retries < 0 || u.ContextWindow < 0 {
			bad("%s: retries and context_window must not be negative", where)
		}
		if err := checkPatch(u.Patch); err != nil {
			bad("%s: patch: %v", where, err)
		}
		if u.PriceInput < 0 || u.PriceOutput < 0 || u.PriceCachedInput < 0 {
			bad("%s: prices must not be negative", where)
		}
	}

	poolIDs := make(map[string]bool, len(pools))
	for i, p := range pools {
		where := namedEntry(bad, poolIDs, "pool", i, "id", p.ID)
		if upstreamIDs[p.ID] {
			bad("%s: id is also an upstream's", where)
		}
		if len(p.Upstreams) == 0 {
			bad("%s: needs at least one upstream", where)
		}
		seen := make(map[string]bool, len(p.Upstreams))
		for _, id := range p.Upstreams {
			switch {
			case !upstreamIDs[id]:
				bad("%s: unknown upstream %q", where, id)
			case seen[id]:
				bad("%s: upstream %q listed twice", where, id)
			}
			seen[id] = true
		}
		if _, err := placement.ParsePolicy(p.Placement); err != nil {
			bad("%s: placement: %v", where, err)
		}
		if len(p.Weights) > 0 && len(p.Weights) != len(p.Upstreams) {
			bad("%s: weights: want one per upstream (%d), got %d", where, len(p.Upstreams), len(p.Weights))
		}
		for _, w := range p.Weights {
			if w <= 0 || w > math.MaxUint32 {
				bad("%s: weights must be positive integers, got %d", where, w)
				break
			}
		}
		if t := p.CacheThreshold; t != nil && !(*t >= 0 && *t <= 1) {
			bad("%s: cache_threshold must be between 0 and 1, got %v", where, *t)
		}
	}

	modelNames := make(map[string]bool, len(models))
	routers := make(map[string]bool)
	for _, m := range models {
		if len(m.Rules) > 0 {
			routers[m.Name] = true
		}
	}
	for i, m := range models {
		where := namedEntry(bad, modelNames, "model", i, "name", m.Name)
		if base, e, ok := strings.Cut(m.Name, ":"); ok && routers[base] && parseEffortExact(e) != effortNone {
			bad("%s: clashes with router model %q and its effort suffix", where, base)
		}
		if len(m.Rules) > 0 || m.Judge != nil {
			validateRouter(bad, where, m, models, routers)
			continue
		}
		if len(m.Upstreams) == 0 {
			bad("%s: needs at least one upstream or rule", where)
		}
		seen := make(map[string]bool, len(m.Upstreams))
		for _, id := range m.Upstreams {
			switch {
			case !upstreamIDs[id] && !poolIDs[id]:
				bad("%s: unknown upstream or pool %q", where, id)
			case seen[id]:
				bad("%s: upstream %q listed twice", where, id)
			}
			seen[id] = true
		}
		if err := checkPatch(m.Patch); err != nil {
			bad("%s: patch: %v", where, err)
		}
		if m.Resume != "" && m.Resume != "on" && m.Resume != "off" {
			bad("%s: resume: want on or off, got %q", where, m.Resume)
		}
		validateRepeatGuard(bad, where, m)
		if m.QueueSize != nil && *m.QueueSize < 0 {
			bad("%s: queue_size must not be negative", where)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("llm_route config: %s", strings.Join(errs, "; "))
	}
	return nil
}

// maxMatchAttrs bounds the distinct attributes a router model's rules
// match on: a request reads them into a fixed array.
const maxMatchAttrs = 32

// validateRouter checks a router model's rules and judge, naming the model
// and the rule in every message.
func validateRouter(bad func(string, ...any), where string, m Model, models []Model, routers map[string]bool) {
	if len(m.Upstreams) > 0 {
		bad("%s: set upstreams or rules, not both", where)
	}
	if len(m.Rules) == 0 {
		bad("%s: needs at least one upstream or rule", where)
	}
	if p := bytes.TrimSpace(m.Patch); len(p) > 0 && string(p) != "null" {
		bad("%s: patch: a router model has none of its own; put it on the models in use", where)
	}
	if m.Resume != "" && m.Resume != "on" && m.Resume != "off" {
		bad("%s: resume: want on or off, got %q", where, m.Resume)
	}
	validateRepeatGuard(bad, where, m)
	if m.QueueSize != nil && *m.QueueSize < 0 {
		bad("%s: queue_size must not be negative", where)
	}
	known := make(map[string]bool, len(models))
	for _, o := range models {
		known[o.Name] = true
	}
	// plainModel reports a problem with a model a rule (or the judge)
	// names, "" when it is a plain model of this config.
	plainModel := func(name string) string {
		switch {
		case !known[name]:
			return fmt.Sprintf("unknown model %q", name)
		case routers[name] || name == m.Name:
			return fmt.Sprintf("%q is a router model", name)
		}
		return ""
	}
	names := make(map[string]bool, len(m.Rules))
	attrs := make(map[string]bool)
	var covered [numEfforts]bool
	for i, r := range m.Rules {
		inModel := func(format string, args ...any) { bad(where+": "+format, args...) }
		rw := where + ": " + namedEntry(inModel, names, "rule", i, "name", r.Name)
		e := effortNone
		if r.Effort != "" {
			if e = parseEffortExact(r.Effort); e == effortNone {
				bad("%s: effort: want low, medium or high, got %q", rw, r.Effort)
			}
		}
		if len(r.Use) == 0 {
			bad("%s: use: needs at least one model", rw)
		}
		seen := make(map[string]bool, len(r.Use))
		for _, u := range r.Use {
			switch why := plainModel(u); {
			case why != "" && known[u]:
				bad("%s: use: %s; a rule's chain names plain models", rw, why)
			case why != "":
				bad("%s: use: %s", rw, why)
			case seen[u]:
				bad("%s: use: model %q listed twice", rw, u)
			}
			seen[u] = true
		}
		if len(r.Weights) > 0 {
			positive := false
			if len(r.Weights) != len(r.Use) {
				bad("%s: weights: want one per model in use (%d), got %d", rw, len(r.Use), len(r.Weights))
			}
			for _, w := range r.Weights {
				switch {
				case w < 0 || w > math.MaxUint32:
					bad("%s: weights: must be from 0 to %d, got %d", rw, uint32(math.MaxUint32), w)
				case w > 0:
					positive = true
				}
			}
			if !positive {
				bad("%s: weights: at least one must be positive", rw)
			}
		}
		attrNames := make([]string, 0, len(r.Match))
		for a := range r.Match {
			attrNames = append(attrNames, a)
		}
		sort.Strings(attrNames) // the same message first on every run
		for _, a := range attrNames {
			switch {
			case a == "":
				bad("%s: match: an attribute name must not be empty", rw)
			case strings.ToLower(a) != a:
				bad("%s: match %q: attribute names are lower-case (headers are read lower-cased)", rw, a)
			case len(r.Match[a]) == 0:
				bad("%s: match %q: needs at least one value", rw, a)
			}
			attrs[a] = true
		}
		if s := r.Shadow; s != nil {
			if why := plainModel(s.Model); why != "" {
				bad("%s: shadow: %s", rw, why)
			}
			if !(s.Fraction >= 0 && s.Fraction <= 1) {
				bad("%s: shadow: fraction must be between 0 and 1, got %v", rw, s.Fraction)
			}
		}
		if len(r.Match) == 0 {
			for x := effortLow; x <= effortHigh; x++ {
				covered[x] = covered[x] || e == effortNone || e == x
			}
		}
	}
	if len(attrs) > maxMatchAttrs {
		bad("%s: more than %d distinct match attributes", where, maxMatchAttrs)
	}
	if len(m.Rules) > 0 {
		for x := effortLow; x <= effortHigh; x++ {
			if !covered[x] {
				bad("%s: no rule without match covers effort %s: a %s request could match no rule", where, x, x)
			}
		}
	}
	if j := m.Judge; j != nil {
		if why := plainModel(j.Model); why != "" {
			bad("%s: judge: %s", where, why)
		}
		if d := j.Deadline; d != nil && (time.Duration(*d) < time.Millisecond || time.Duration(*d) > 10*time.Second) {
			bad("%s: judge: deadline must be between 1ms and 10s", where)
		}
	}
}

// checkPatch accepts an absent patch or a JSON object.
func checkPatch(raw json.RawMessage) error {
	trimmed := strings.TrimSpace(string(raw))
	if trimmed == "" || trimmed == "null" {
		return nil
	}
	if trimmed[0] != '{' || !json.Valid(raw) {
		return fmt.Errorf("must be a JSON object")
	}
	return nil
}

// validHeaderName reports whether s is an RFC 7230 token.
func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' {
			continue
		}
		if !strings.ContainsRune("!#$%&'*+-.^_`|~", rune(c)) {
			return false
		}
	}
	return true
}

// checkStaticHeader rejects provider headers that would smuggle credentials
// or break framing; the key goes through Provider.Key only.
func checkStaticHeader(name string) error {
	if !validHeaderName(name) {
		return fmt.Errorf("%q is not a valid header name", name)
	}
	switch strings.ToLower(name) {
	case "authorization", "content-length", "content-type", "host", "transfer-encoding", "connection":
		return fmt.Errorf("header %q is set by the proxy and cannot be configured", name)
	}
	return nil
}

// CheckProviderURL reports whether raw is usable as a provider url: an
// absolute http or https URL with a host and without query or fragment.
// The Caddyfile adapter calls it so that `caddy adapt` rejects a bad url at
// its line; provisioning checks the same.
func CheckProviderURL(raw string) error { return checkBaseURL(raw) }

// checkBaseURL accepts an absolute http(s) URL without query or fragment.
func checkBaseURL(raw string) error {
	if raw == "" {
		return fmt.Errorf("is required")
	}
	if lower := strings.ToLower(raw); !strings.HasPrefix(lower, "http://") && !strings.HasPrefix(lower, "https://") {
		// Checked first: "localhost:8080/v1" would parse as scheme "localhost".
		return fmt.Errorf("%q must start with http:// or https://", redactURL(raw))
	}
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("%q is not a valid URL", redactURL(raw))
	}
	if u.Host == "" {
		return fmt.Errorf("%q has no host", redactURL(raw))
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("%q must not have a query or fragment", redactURL(raw))
	}
	return nil
}

// redactURL hides credentials embedded in a URL (user:pass@host) so it can
// be logged or shown in an error.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		// Not parseable: keep only what cannot be a secret.
		if i := strings.LastIndex(raw, "@"); i >= 0 {
			return "[redacted]@" + raw[i+1:]
		}
		return raw
	}
	if u.User != nil {
		u.User = url.User("redacted")
	}
	return u.String()
}

// namedEntry names the i-th entry of a config list in its errors (`provider
// "x"`, or `providers[2]` while it has no name), reports a missing or
// repeated name (field: "id" or "name") through bad, and records the name in
// seen.
func namedEntry(bad func(string, ...any), seen map[string]bool, kind string, i int, field, name string) string {
	where := fmt.Sprintf("%ss[%d]", kind, i)
	if name != "" {
		where = fmt.Sprintf("%s %q", kind, name)
	}
	switch {
	case name == "":
		bad("%s: %s is required", where, field)
	case seen[name]:
		bad("%s: duplicate %s", where, field)
	}
	seen[name] = true
	return where
}
