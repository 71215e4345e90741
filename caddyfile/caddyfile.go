package caddyfile

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	_ "github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy" // registers the http transport module
	"github.com/dustin/go-humanize"

	"github.com/llm-route/caddy-llm-route/llmroute"
	"github.com/llm-route/caddy-llm-route/llmroute/placement"
)

func init() {
	httpcaddyfile.RegisterHandlerDirective("llm_route", parseCaddyfile)
	httpcaddyfile.RegisterDirectiveOrder("llm_route", httpcaddyfile.Before, "reverse_proxy")
	// Beside Caddy's own metrics handler, so before llm_route: a site can
	// serve both, the status behind a matcher or in a handle_path block.
	httpcaddyfile.RegisterHandlerDirective("llm_route_status", parseStatusCaddyfile)
	httpcaddyfile.RegisterDirectiveOrder("llm_route_status", httpcaddyfile.After, "metrics")
}

// parseStatusCaddyfile sets up the llm_route_status handler, which has no
// arguments or fields:
//
//	llm_route_status [<matcher>]
func parseStatusCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	h.Next() // the directive
	if h.NextArg() {
		return nil, h.ArgErr()
	}
	if h.NextBlock(0) {
		return nil, h.Errf("llm_route_status has no fields")
	}
	return llmroute.StatusHandler{}, nil
}

// parseCaddyfile sets up the llm_route handler from Caddyfile tokens:
//
//	llm_route [<matcher>] {
//	    request_timeout     <duration>
//	    max_request_body    <size>
//	    queue_size          <int>
//	    queue_timeout       <duration>
//	    retry_after_max     <duration>
//	    heartbeat_interval  <duration>
//	    cors                <origin>|* [<origin>...]
//	    max_rewrite_size    <size>
//	    client_write_timeout <duration>
//	    route_headers       [true|false]
//	    long_context_threshold <int>
//	    state memory|redis {
//	        address        <host:port>
//	        username       <name or placeholder>
//	        password       <password or placeholder>
//	        db             <int>
//	        prefix         <key prefix>
//	        tls            [true|false]
//	        timeout        <duration>
//	        lease_ttl      <duration>
//	        on_state_error local|reject
//	    }
//
//	    provider <id> {
//	        url                 <base url>
//	        key                 <key or placeholder>
//	        keys                <key> [<key>...]      # a pool, instead of key; repeatable
//	        key_rotation        random|round_robin|least_used
//	        key_cooldown_auth   <duration>
//	        key_cooldown_quota  <duration>
//	        key_cooldown_rate   <duration>
//	        client_key_header   <header name>
//	        max_concurrency     <int>
//	        capacity            <int>
//	        session_header      <header name>
//	        apis                chat|messages|responses|embeddings|completions [...]
//	        auth                bearer|x-api-key|api-key
//	        keep_billing_header [true|false]
//	        think_tags          off|split|strip|true|false
//	        reasoning_field     <field>
//	        reasoning_empty_ok  [true|false]
//	        backoff             <duration>
//	        first_byte_timeout  <duration>
//	        stream_idle_timeout <duration>
//	        probe_interval      <duration>
//	        retries             <int>
//	        retry_after_wait    <duration>
//	        long_context_capacity <int>
//	        header              <name> <value>
//	        forward_headers     <name> [<name>...]
//	        patch               <patch>
//	        transport http {
//	            <reverse_proxy's http transport options>
//	        }
//	    }
//
//	    upstream <id> [<provider> <model>] {
//	        provider            <provider id>
//	        model               <real model name>
//	        max_concurrency     <int>
//	        apis                chat|messages|responses|embeddings|completions [...]
//	        think_tags          off|split|strip|true|false
//	        backoff             <duration>
//	        first_byte_timeout  <duration>
//	        stream_idle_timeout <duration>
//	        probe_interval      <duration>
//	        price_input         <USD per million tokens>
//	        price_output        <USD per million tokens>
//	        price_cached_input  <USD per million tokens>
//	        retries             <int>
//	        retry_after_wait    <duration>
//	        context_window      <int>
//	        prefill             [true|false]
//	        patch               <patch>
//	    }
//
//	    pool <id> {
//	        upstreams           <upstream id> [<upstream id>...]
//	        placement           first|least_busy|sticky|cache_aware
//	        weights             <int> [<int>...]
//	        affinity_key        <placeholder expression>
//	        affinity_wait       <duration>
//	        affinity_ttl        <duration>
//	        cache_threshold     <0 to 1>
//	    }
//
//	    model <name> [<upstream or pool id>...] {
//	        upstreams           <upstream or pool id> [<upstream or pool id>...]
//	        queue_size          <int>
//	        queue_timeout       <duration>
//	        resume              on|off
//	        repeat_guard        on|off
//	        repeat_min_span     <runes>
//	        repeat_max_period   <runes>
//	        repeat_recoveries   <0 to 3>
//	        patch               <patch>
//	    }
//
//	    model <name> {                      # a router model: rules, no upstreams
//	        judge               <model> [<deadline>]
//	        queue_size, queue_timeout, resume, repeat_* as above
//	        rule <name> {
//	            priority        <int>
//	            effort          low|medium|high
//	            match           <attribute> <value> [<value>...]
//	            use             <model> [<model>...]
//	            weights         <int> [<int>...]
//	            shadow          <model> <fraction>
//	        }
//	    }
//
//	    key <id> {
//	        secret              <secret or placeholder>
//	        sha256              <hex digest of the secret>
//	        models              <name or glob> [...]
//	        rpm                 <int>
//	        burst               <int>
//	        tokens_per_day      <int>
//	        spend_per_day       <USD>
//	        spend_per_month     <USD>
//	        labels {
//	            <name>          <value>
//	        }
//	    }
//	}
//
// The block of `upstream` and `model` is optional when the short form on the
// opening line says everything: `upstream <id> <provider> <model>`,
// `model <name> <upstream id>...`. `upstreams` may be repeated; each line
// appends, and the order is the model's priority order. `header` may be
// repeated (one header per line), and so may `forward_headers` (each line
// appends). A router model's `rule` may be repeated (names unique in the
// model), and so may a rule's `match` (one attribute per line). Every other setting may appear once per
// block, and provider, upstream and model ids must be unique. A pool's
// `upstreams` may be repeated too; its id must differ from every upstream's.
//
// A <duration> is a Go/Caddy duration (`30s`, `1h15m`, `1d`) or an ISO-8601
// one (`PT30S`, `PT500MS`, `P1D`, `P1M` = 30 days, `P1Y` = 365 days); it is
// written to JSON as a Go duration string. A <size> is a byte count, plain or
// humanized (`32MiB`, `1MB`, `1048576`). `reasoning_empty_ok` alone means
// true. `think_tags` `true` and `false` are written as `split` and `off`;
// any other word is kept as written (the handler treats it as off and warns).
//
// A <patch> is a JSON object, written either as one argument of raw JSON
// (in backticks or a heredoc) or as a block:
//
//	patch `{"reasoning": {"enabled": false}}`
//
//	patch <<JSON
//	    {"reasoning": {"enabled": false}}
//	    JSON
//
//	patch {
//	    temperature  0.7                # number
//	    stream       true               # true, false, null: JSON literals
//	    effort       high               # anything else: a string
//	    user         "true"             # double quotes: always a string
//	    model_name   `"true"`           # backticks: raw JSON of any type
//	    stop         `["\n\n"]`
//	    provider {                      # a block: a nested object
//	        ignore   deepseek openai    # two or more values: an array
//	        order    [ deepseek ]       # [ ... ]: an array (may span lines)
//	        only     [ ]                # the empty array
//	    }
//	}
//
// A `[` array may continue over several lines up to its `]` (`caddy fmt`
// does not indent such lines). Arrays of objects need raw JSON. Keys keep the
// order they are written in. A key may appear once per block.
// Numbers must fit a float64, and integers must be at most 2^53 in magnitude:
// Caddy stores a loaded config as generic JSON (float64 numbers, keys sorted)
// and would otherwise change the value silently.
//
// Keys and values are not resolved here: `{env.NAME}` and `{file./path}`
// stay as text for the handler to resolve at provision time. (Caddy itself
// still substitutes `{$NAME}` while parsing the Caddyfile, which bakes the
// value into the adapted JSON, and expands its own request placeholder
// shorthands such as `{path}` in every token.)
func parseCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	return unmarshalHandler(h.Dispenser)
}

// unmarshalHandler parses one llm_route directive (the matcher, if any,
// already removed) into a Handler.
func unmarshalHandler(d *caddyfile.Dispenser) (*llmroute.Handler, error) {
	p := &parser{
		d:         d,
		h:         new(llmroute.Handler),
		providers: make(map[string]int),
		upstreams: make(map[string]int),
		pools:     make(map[string]int),
		models:    make(map[string]int),
		keys:      make(map[string]int),
		routers:   make(map[string]bool),
	}
	if err := p.handler(); err != nil {
		return nil, err
	}
	return p.h, nil
}

// parser holds the state of one directive: the ids seen so far (with the
// line that defined them) and the references to check once all are known.
type parser struct {
	d *caddyfile.Dispenser
	h *llmroute.Handler

	providers map[string]int
	upstreams map[string]int
	pools     map[string]int
	models    map[string]int
	keys      map[string]int
	routers   map[string]bool // models with rules

	// refs are provider and upstream references, checked at the end so that
	// definitions may come in any order. Each error is made while the
	// dispenser stands on the reference, so it carries that line.
	refs []reference

	depth int // nesting of the patch being parsed
}

type reference struct {
	providerRef bool // else an upstream reference
	orPool      bool // an upstream reference that may name a pool (a model's)
	poolID      bool // a pool's own id, which no upstream may have
	// model: a model named by a router model's rule or judge, which must
	// be a plain model; routerErr is the error when it is a router model.
	model     bool
	routerErr error
	id        string
	err       error
}

// settings remembers which settings a block has seen and where.
type settings map[string]int

// once records the setting at the cursor and rejects a second occurrence.
func (s settings) once(d *caddyfile.Dispenser, where, name string) error {
	if line, ok := s[name]; ok {
		return d.Errf("%s%s already specified at line %d", where, name, line)
	}
	s[name] = d.Line()
	return nil
}

func (p *parser) handler() error {
	d := p.d
	if !d.Next() { // consume directive name
		return d.Err("llm_route: no tokens")
	}
	if d.NextArg() {
		return d.Errf("llm_route: unexpected argument %q (only a matcher may precede the block)", d.Val())
	}
	seen := settings{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		name := d.Val()
		var err error
		switch name {
		case "provider":
			err = p.provider()
		case "upstream":
			err = p.upstream()
		case "pool":
			err = p.pool()
		case "model":
			err = p.model()
		case "key":
			err = p.key()
		case "state":
			if err = seen.once(d, "", name); err != nil {
				return err
			}
			err = p.state()
		case "request_timeout", "queue_timeout", "retry_after_max", "heartbeat_interval",
			"client_write_timeout", "max_request_body", "queue_size", "cors", "max_rewrite_size", "route_headers":
			if err = seen.once(d, "", name); err != nil {
				return err
			}
			err = p.handlerSetting(name)
		case "long_context_threshold":
			if err = seen.once(d, "", name); err != nil {
				return err
			}
			p.h.LongContextThreshold, err = p.count("", name)
		default:
			return d.Errf("unrecognized llm_route subdirective %q", name)
		}
		if err != nil {
			return err
		}
	}
	for _, r := range p.refs {
		if r.model {
			if _, ok := p.models[r.id]; !ok {
				return r.err
			}
			if p.routers[r.id] {
				return r.routerErr
			}
			continue
		}
		if r.poolID {
			if _, clash := p.upstreams[r.id]; clash {
				return r.err
			}
			continue
		}
		known := p.upstreams
		if r.providerRef {
			known = p.providers
		}
		if _, ok := known[r.id]; !ok {
			if _, pool := p.pools[r.id]; !r.orPool || !pool {
				return r.err
			}
		}
	}
	return nil
}

// pool parses `pool <id> { upstreams …; placement …; weights …;
// affinity_key …; affinity_wait …; affinity_ttl …; cache_threshold … }`.
func (p *parser) pool() error {
	d := p.d
	id, err := p.id("pool", p.pools)
	if err != nil {
		return err
	}
	where := fmt.Sprintf("pool %q: ", id)
	p.refs = append(p.refs, reference{poolID: true, id: id, err: d.Errf("%sid is also an upstream's", where)})
	pl := llmroute.Pool{ID: id}
	listed := map[string]int{}
	seen := settings{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		name := d.Val()
		if name != "upstreams" {
			if err := seen.once(d, where, name); err != nil {
				return err
			}
		}
		switch name {
		case "upstreams":
			var ids []string
			if ids, err = p.args(where, name, 1, -1); err != nil {
				return err
			}
			for _, uid := range ids {
				if line, dup := listed[uid]; dup {
					return d.Errf("%supstream %q listed twice (first at line %d)", where, uid, line)
				}
				listed[uid] = d.Line()
				pl.Upstreams = append(pl.Upstreams, uid)
				p.refs = append(p.refs, reference{id: uid, err: d.Errf("%sunknown upstream %q", where, uid)})
			}
		case "placement":
			if pl.Placement, err = p.str(where, name); err == nil {
				if _, perr := placement.ParsePolicy(pl.Placement); perr != nil {
					err = d.Errf("%s%s: %v", where, name, perr)
				}
			}
		case "weights":
			var ws []string
			if ws, err = p.args(where, name, 1, -1); err != nil {
				return err
			}
			for _, w := range ws {
				n, aerr := strconv.Atoi(w)
				if aerr != nil || n <= 0 || n > math.MaxUint32 {
					return d.Errf("%sweights: %q is not a positive integer", where, w)
				}
				pl.Weights = append(pl.Weights, n)
			}
		case "affinity_key":
			pl.AffinityKey, err = p.str(where, name)
		case "affinity_wait":
			pl.AffinityWait, err = p.duration(where, name)
		case "affinity_ttl":
			pl.AffinityTTL, err = p.duration(where, name)
		case "cache_threshold":
			var s string
			if s, err = p.str(where, name); err == nil {
				f, ferr := strconv.ParseFloat(s, 64)
				if ferr != nil || !(f >= 0 && f <= 1) {
					return d.Errf("%s%s: want a number from 0 to 1, got %q", where, name, s)
				}
				pl.CacheThreshold = &f
			}
		default:
			return d.Errf("%sunrecognized subdirective %q", where, name)
		}
		if err != nil {
			return err
		}
	}
	if len(pl.Upstreams) == 0 {
		return d.Errf("%sneeds at least one upstream (`upstreams` in its block)", where)
	}
	if len(pl.Weights) > 0 && len(pl.Weights) != len(pl.Upstreams) {
		return d.Errf("%sweights: want one per upstream (%d), got %d", where, len(pl.Upstreams), len(pl.Weights))
	}
	p.h.Pools = append(p.h.Pools, pl)
	return nil
}

func (p *parser) handlerSetting(name string) error {
	h := p.h
	var err error
	switch name {
	case "request_timeout":
		h.RequestTimeout, err = p.duration("", name)
	case "queue_timeout":
		h.QueueTimeout, err = p.duration("", name)
	case "retry_after_max":
		h.RetryAfterMax, err = p.duration("", name)
	case "heartbeat_interval":
		h.HeartbeatInterval, err = p.duration("", name)
	case "client_write_timeout":
		h.ClientWriteTimeout, err = p.duration("", name)
	case "queue_size":
		h.QueueSize, err = p.count("", name)
	case "max_request_body":
		h.MaxRequestBody, err = p.size("", name)
	case "max_rewrite_size":
		h.MaxRewriteSize, err = p.size("", name)
	case "cors":
		h.CORS, err = p.args("", name, 1, -1)
	case "route_headers":
		var on bool
		on, err = p.flag("", name)
		h.RouteHeaders = &on
	}
	return err
}

// provider parses `provider <id> { … }`.
func (p *parser) provider() error {
	d := p.d
	id, err := p.id("provider", p.providers)
	if err != nil {
		return err
	}
	missingURL := d.Errf("provider %q: url is required", id)
	prov := llmroute.Provider{ID: id}
	where := fmt.Sprintf("provider %q: ", id)
	seen := settings{}
	headerLines := map[string]int{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		name := d.Val()
		if name != "header" && name != "forward_headers" && name != "keys" {
			if err := seen.once(d, where, name); err != nil {
				return err
			}
		}
		switch name {
		case "url":
			if prov.URL, err = p.str(where, name); err == nil {
				if uerr := llmroute.CheckProviderURL(prov.URL); uerr != nil {
					err = d.Errf("%surl: %v", where, uerr)
				}
			}
		case "key":
			prov.Key, err = p.str(where, name)
		case "keys": // repeatable: each line appends
			var keys []string
			keys, err = p.args(where, name, 1, -1)
			prov.Keys = append(prov.Keys, keys...)
		case "key_rotation":
			prov.KeyRotation, err = p.str(where, name)
		case "key_cooldown_auth":
			prov.KeyCooldownAuth, err = p.duration(where, name)
		case "key_cooldown_quota":
			prov.KeyCooldownQuota, err = p.duration(where, name)
		case "key_cooldown_rate":
			prov.KeyCooldownRate, err = p.duration(where, name)
		case "client_key_header":
			prov.ClientKeyHeader, err = p.str(where, name)
		case "max_concurrency":
			prov.MaxConcurrency, err = p.count(where, name)
		case "capacity":
			prov.Capacity, err = p.count(where, name)
		case "session_header":
			prov.SessionHeader, err = p.str(where, name)
		case "think_tags":
			prov.ThinkTags, err = p.thinkTags(where, name)
		case "reasoning_field":
			prov.ReasoningField, err = p.str(where, name)
		case "reasoning_empty_ok":
			prov.ReasoningEmptyOK, err = p.flag(where, name)
		case "apis":
			prov.APIs, err = p.args(where, name, 1, -1)
		case "auth":
			prov.Auth, err = p.str(where, name)
		case "keep_billing_header":
			prov.KeepBillingHeader, err = p.flag(where, name)
		case "backoff":
			prov.Backoff, err = p.duration(where, name)
		case "first_byte_timeout":
			prov.FirstByteTimeout, err = p.duration(where, name)
		case "stream_idle_timeout":
			prov.StreamIdleTimeout, err = p.duration(where, name)
		case "probe_interval":
			prov.ProbeInterval, err = p.duration(where, name)
		case "retries":
			prov.Retries, err = p.count(where, name)
		case "retry_after_wait":
			prov.RetryAfterWait, err = p.duration(where, name)
		case "long_context_capacity":
			prov.LongContextCapacity, err = p.count(where, name)
		case "patch":
			prov.Patch, err = p.patch(where)
		case "forward_headers": // repeatable: each line appends
			var names []string
			names, err = p.args(where, name, 1, -1)
			prov.ForwardHeaders = append(prov.ForwardHeaders, names...)
		case "transport":
			prov.TransportRaw, err = p.transport(where)
		case "header":
			var args []string
			if args, err = p.args(where, name, 2, 2); err != nil {
				return err
			}
			canon := strings.ToLower(args[0])
			if line, dup := headerLines[canon]; dup {
				return d.Errf("%sheader %q already specified at line %d", where, args[0], line)
			}
			headerLines[canon] = d.Line()
			if prov.Headers == nil {
				prov.Headers = make(map[string]string)
			}
			prov.Headers[args[0]] = args[1]
		default:
			return d.Errf("%sunrecognized subdirective %q", where, name)
		}
		if err != nil {
			return err
		}
	}
	if prov.URL == "" {
		return missingURL
	}
	if prov.Key != "" && len(prov.Keys) > 0 {
		return d.Errf("%skey and keys are both set; use one (keys is a pool of several)", where)
	}
	p.h.Providers = append(p.h.Providers, prov)
	return nil
}

// upstream parses `upstream <id> [<provider> <model>] [{ … }]`.
func (p *parser) upstream() error {
	d := p.d
	if !d.NextArg() {
		return d.Errf("upstream: want an id")
	}
	id, err := p.newID("upstream", p.upstreams)
	if err != nil {
		return err
	}
	up := llmroute.Upstream{ID: id}
	where := fmt.Sprintf("upstream %q: ", id)
	missing := d.Errf("%sprovider and model are required (`upstream <id> <provider> <model>` or a block)", where)
	seen := settings{}
	if d.NextArg() {
		if err := seen.once(d, where, "provider"); err != nil {
			return err
		}
		p.providerRef(id)
		up.Provider = d.Val()
		if !d.NextArg() {
			return d.Errf("%swant `upstream <id> <provider> <model>`, the model is missing", where)
		}
		seen["model"] = d.Line()
		up.Model = d.Val()
		if d.NextArg() {
			return d.Errf("%sunexpected argument %q after the model", where, d.Val())
		}
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		name := d.Val()
		if err := seen.once(d, where, name); err != nil {
			return err
		}
		switch name {
		case "provider":
			if up.Provider, err = p.str(where, name); err == nil {
				p.providerRef(id)
			}
		case "model":
			up.Model, err = p.str(where, name)
		case "max_concurrency":
			up.MaxConcurrency, err = p.count(where, name)
		case "apis":
			up.APIs, err = p.args(where, name, 1, -1)
		case "think_tags":
			up.ThinkTags, err = p.thinkTags(where, name)
		case "backoff":
			up.Backoff, err = p.duration(where, name)
		case "first_byte_timeout":
			up.FirstByteTimeout, err = p.duration(where, name)
		case "stream_idle_timeout":
			up.StreamIdleTimeout, err = p.duration(where, name)
		case "probe_interval":
			up.ProbeInterval, err = p.duration(where, name)
		case "price_input":
			up.PriceInput, err = p.usd(where, name)
		case "price_output":
			up.PriceOutput, err = p.usd(where, name)
		case "price_cached_input":
			up.PriceCachedInput, err = p.usd(where, name)
		case "retries":
			var n int
			n, err = p.count(where, name)
			up.Retries = &n
		case "retry_after_wait":
			up.RetryAfterWait, err = p.duration(where, name)
		case "context_window":
			up.ContextWindow, err = p.count(where, name)
		case "prefill":
			var b bool
			if b, err = p.flag(where, name); err == nil {
				up.Prefill = &b
			}
		case "patch":
			up.Patch, err = p.patch(where)
		default:
			return d.Errf("%sunrecognized subdirective %q", where, name)
		}
		if err != nil {
			return err
		}
	}
	if up.Provider == "" || up.Model == "" {
		return missing
	}
	p.h.Upstreams = append(p.h.Upstreams, up)
	return nil
}

// transport parses `transport <name> { … }` with the transport module's own
// Caddyfile parser, as reverse_proxy does, so every option of
// `reverse_proxy`'s `transport http` block works here too.
func (p *parser) transport(where string) (json.RawMessage, error) {
	d := p.d
	if !d.NextArg() {
		return nil, d.Errf("%stransport: want a transport name, e.g. `transport http { … }`", where)
	}
	name := d.Val()
	unm, err := caddyfile.UnmarshalModule(d, "http.reverse_proxy.transport."+name)
	if err != nil {
		return nil, err
	}
	rt, ok := unm.(http.RoundTripper)
	if !ok {
		return nil, d.Errf("%stransport: module %q is not an HTTP transport", where, name)
	}
	return caddyconfig.JSONModuleObject(rt, "protocol", name, nil), nil
}

// providerRef records that the provider named at the cursor must exist.
func (p *parser) providerRef(upstreamID string) {
	d := p.d
	p.refs = append(p.refs, reference{
		providerRef: true,
		id:          d.Val(),
		err:         p.d.Errf("upstream %q: unknown provider %q", upstreamID, d.Val()),
	})
}

// model parses `model <name> [<upstream id>...] [{ … }]`.
func (p *parser) model() error {
	d := p.d
	if !d.NextArg() {
		return d.Errf("model: want a name")
	}
	name, err := p.newID("model", p.models)
	if err != nil {
		return err
	}
	m := llmroute.Model{Name: name, Upstreams: []string{}}
	where := fmt.Sprintf("model %q: ", name)
	missing := d.Errf("%sneeds at least one upstream (`model <name> <upstream id>...` or `upstreams` in its block) or rule (`rule <name> { … }` in its block)", where)
	listed := map[string]int{}
	addUpstreams := func() error {
		for d.NextArg() {
			id := d.Val()
			if id == "" {
				return d.Errf("%supstream id must not be empty", where)
			}
			if line, dup := listed[id]; dup {
				return d.Errf("%supstream %q listed twice (first at line %d)", where, id, line)
			}
			listed[id] = d.Line()
			m.Upstreams = append(m.Upstreams, id)
			p.refs = append(p.refs, reference{id: id, orPool: true, err: d.Errf("%sunknown upstream %q", where, id)})
		}
		return nil
	}
	if err := addUpstreams(); err != nil {
		return err
	}
	seen := settings{}
	rules := map[string]int{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		opt := d.Val()
		if opt != "upstreams" && opt != "rule" {
			if err := seen.once(d, where, opt); err != nil {
				return err
			}
		}
		switch opt {
		case "rule":
			var r llmroute.Rule
			if r, err = p.rule(name, rules); err == nil {
				m.Rules = append(m.Rules, r)
				p.routers[name] = true
			}
		case "judge":
			m.Judge, err = p.judge(name)
		case "upstreams":
			if d.CountRemainingArgs() == 0 {
				return d.Errf("%supstreams: want at least one upstream id", where)
			}
			if err = addUpstreams(); err == nil {
				err = p.noBlock(where, opt)
			}
		case "queue_size":
			var n int
			if n, err = p.count(where, opt); err == nil {
				m.QueueSize = &n
			}
		case "queue_timeout":
			m.QueueTimeout, err = p.duration(where, opt)
		case "resume":
			if m.Resume, err = p.str(where, opt); err == nil && m.Resume != "on" && m.Resume != "off" {
				err = d.Errf("%sresume: want on or off, got %q", where, m.Resume)
			}
		case "repeat_guard":
			if m.RepeatGuard, err = p.str(where, opt); err == nil && m.RepeatGuard != "on" && m.RepeatGuard != "off" {
				err = d.Errf("%srepeat_guard: want on or off, got %q", where, m.RepeatGuard)
			}
		case "repeat_min_span":
			m.RepeatMinSpan, err = p.count(where, opt)
		case "repeat_max_period":
			m.RepeatMaxPeriod, err = p.count(where, opt)
		case "repeat_recoveries":
			var n int
			if n, err = p.count(where, opt); err == nil && n > 3 {
				err = d.Errf("%srepeat_recoveries must be between 0 and 3, got %d", where, n)
			}
			m.RepeatRecoveries = &n
		case "patch":
			m.Patch, err = p.patch(where)
		default:
			return d.Errf("%sunrecognized subdirective %q", where, opt)
		}
		if err != nil {
			return err
		}
	}
	switch {
	case len(m.Upstreams) > 0 && len(m.Rules) > 0:
		return d.Errf("%sset upstreams or rules, not both", where)
	case len(m.Upstreams) == 0 && len(m.Rules) == 0:
		return missing
	case m.Judge != nil && len(m.Rules) == 0:
		return d.Errf("%sjudge: only a router model (one with rules) has a judge", where)
	case len(m.Rules) > 0 && m.Patch != nil:
		return d.Errf("%spatch: a router model has none of its own; put it on the models in use", where)
	}
	p.h.Models = append(p.h.Models, m)
	return nil
}

// id reads the single id argument of `provider <id>`.
func (p *parser) id(kind string, known map[string]int) (string, error) {
	d := p.d
	if !d.NextArg() {
		return "", d.Errf("%s: want an id", kind)
	}
	id, err := p.newID(kind, known)
	if err != nil {
		return "", err
	}
	if d.NextArg() {
		return "", d.Errf("%s %q: unexpected argument %q", kind, id, d.Val())
	}
	return id, nil
}

// newID takes the id at the cursor and rejects an empty or duplicate one.
func (p *parser) newID(kind string, known map[string]int) (string, error) {
	d := p.d
	id := d.Val()
	if id == "" {
		return "", d.Errf("%s id must not be empty", kind)
	}
	if line, dup := known[id]; dup {
		return "", d.Errf("duplicate %s %q (first defined at line %d)", kind, id, line)
	}
	known[id] = d.Line()
	return id, nil
}

// args reads the rest of the line as the arguments of setting name and
// checks their count (max < 0: no upper bound). The setting takes no block.
func (p *parser) args(where, name string, minArgs, maxArgs int) ([]string, error) {
	d := p.d
	args := d.RemainingArgs()
	if len(args) < minArgs || maxArgs >= 0 && len(args) > maxArgs {
		var want string
		switch {
		case minArgs == maxArgs && minArgs == 1:
			want = "1 argument"
		case minArgs == maxArgs:
			want = fmt.Sprintf("%d arguments", minArgs)
		case maxArgs < 0:
			want = fmt.Sprintf("at least %d arguments", minArgs)
		default:
			want = fmt.Sprintf("%d to %d arguments", minArgs, maxArgs)
		}
		return nil, d.Errf("%s%s: want %s, got %d", where, name, want, len(args))
	}
	return args, p.noBlock(where, name)
}

// noBlock rejects a block opened after a setting that takes none.
func (p *parser) noBlock(where, name string) error {
	if p.blockFollows() {
		return p.d.Errf("%s%s: unexpected block", where, name)
	}
	return nil
}

// blockFollows reports whether the next token is on the current line, which,
// once NextArg has returned false, means it is a block's opening brace. The
// cursor does not move.
func (p *parser) blockFollows() bool {
	d := p.d
	if d.NextLine() {
		d.Prev()
		return false
	}
	if !d.Next() {
		return false
	}
	open := d.Val() == "{" && !d.Token().Quoted()
	d.Prev()
	return open
}

func (p *parser) str(where, name string) (string, error) {
	args, err := p.args(where, name, 1, 1)
	if err != nil {
		return "", err
	}
	return args[0], nil
}

// count reads a non-negative integer.
func (p *parser) count(where, name string) (int, error) {
	s, err := p.str(where, name)
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		return 0, p.d.Errf("%s%s: %q is not an integer", where, name, s)
	}
	if n < 0 {
		return 0, p.d.Errf("%s%s: must not be negative, got %d", where, name, n)
	}
	return n, nil
}

// size reads a byte size such as 32MiB, 1MB or 1048576.
func (p *parser) size(where, name string) (int64, error) {
	s, err := p.str(where, name)
	if err != nil {
		return 0, err
	}
	n, err := humanize.ParseBytes(s)
	if err != nil {
		return 0, p.d.Errf("%s%s: invalid size %q: want e.g. 32MiB, 1MB or 1048576", where, name, s)
	}
	if n == 0 {
		return 0, p.d.Errf("%s%s: must be greater than 0", where, name)
	}
	if n > math.MaxInt64 {
		return 0, p.d.Errf("%s%s: %q is too large", where, name, s)
	}
	return int64(n), nil
}

// duration reads a Go/Caddy or ISO-8601 duration.
func (p *parser) duration(where, name string) (*llmroute.Duration, error) {
	s, err := p.str(where, name)
	if err != nil {
		return nil, err
	}
	v, err := llmroute.ParseDuration(s)
	if err != nil {
		return nil, p.d.Errf("%s%s: %v", where, name, err)
	}
	dur := llmroute.Duration(v)
	return &dur, nil
}

// flag reads an optional boolean; the bare setting means true.
func (p *parser) flag(where, name string) (bool, error) {
	args, err := p.args(where, name, 0, 1)
	if err != nil {
		return false, err
	}
	if len(args) == 0 {
		return true, nil
	}
	b, err := strconv.ParseBool(args[0])
	if err != nil {
		return false, p.d.Errf("%s%s: want true or false, got %q", where, name, args[0])
	}
	return b, nil
}

// thinkTags reads a think_tags mode. The known words are normalized (true is
// split, false is off); an unknown word is kept for the handler to warn about.
func (p *parser) thinkTags(where, name string) (llmroute.ThinkTags, error) {
	s, err := p.str(where, name)
	if err != nil {
		return "", err
	}
	switch strings.ToLower(s) {
	case "true":
		return "split", nil
	case "false":
		return "off", nil
	case "off", "split", "strip":
		return llmroute.ThinkTags(strings.ToLower(s)), nil
	}
	return llmroute.ThinkTags(s), nil
}
