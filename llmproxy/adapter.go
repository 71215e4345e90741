// Package llmproxy is the Caddy config adapter `llmproxy` (module
// caddy.adapters.llmproxy): it reads the config.yaml of the original
// llm-proxy (blocks server, providers, upstreams, models) and writes the
// Caddy JSON that serves the same, so
//
//	caddy run --config config.yaml --adapter llmproxy
//
// replaces the original proxy without touching its file: one plain-HTTP
// server on server.host:server.port (defaults 0.0.0.0 and 8100) with
// `GET /metrics` and the llm_route handler carrying every provider,
// upstream and model field. An unknown key is a warning (the original
// ignored it); a bad value is an error naming the file, line and field.
package llmproxy

import (
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"regexp"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/caddyserver/caddy/v2/caddyconfig"

	"github.com/llm-route/caddy-llm-route/llmroute"
)

func init() {
	caddyconfig.RegisterAdapter("llmproxy", Adapter{})
}

// Defaults of the original's server block.
const (
	defaultHost = "0.0.0.0"
	defaultPort = 8100
)

// Adapter adapts llm-proxy's config.yaml to Caddy JSON.
type Adapter struct{}

// Adapt converts the YAML in body to Caddy JSON. options["filename"]
// names the file in warnings and errors (default config.yaml).
func (Adapter) Adapt(body []byte, options map[string]any) ([]byte, []caddyconfig.Warning, error) {
	file, _ := options["filename"].(string)
	if file == "" {
		file = "config.yaml"
	}
	a := &adapter{file: file}
	cfg, err := a.adapt(body)
	if err != nil {
		return nil, a.warnings, err
	}
	out, err := json.Marshal(cfg)
	return out, a.warnings, err
}

// adapter is the state of one Adapt call.
type adapter struct {
	file     string
	warnings []caddyconfig.Warning
	nodes    int // nodes rendered so far (see maxNodes)

	// Where each entry starts (its first key), by list index, and the
	// nodes the cross-entry checks point at.
	providerAt, upstreamAt, modelAt []*yaml.Node
	upstreamZero                    []*yaml.Node   // an explicit max_concurrency: 0, else nil
	modelRefs                       [][]*yaml.Node // each model's upstream references
}

// errAt is an error at the line of n: `config.yaml:12: upstreams[0].backoff: …`.
func (a *adapter) errAt(n *yaml.Node, path, format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	if path != "" {
		msg = path + ": " + msg
	}
	if n != nil && n.Line > 0 {
		return fmt.Errorf("%s:%d: %s", a.file, n.Line, msg)
	}
	return fmt.Errorf("%s: %s", a.file, msg)
}

// warn records a warning at the line of n; `caddy adapt` and `caddy run`
// print it with the file and line.
func (a *adapter) warn(n *yaml.Node, path, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if path != "" {
		msg = path + ": " + msg
	}
	w := caddyconfig.Warning{File: a.file, Message: msg}
	if n != nil {
		w.Line = n.Line
	}
	a.warnings = append(a.warnings, w)
}

// yamlLine finds the line in the YAML library's own syntax errors
// ("yaml: line 3: mapping values are not allowed in this context").
var yamlLine = regexp.MustCompile(`^yaml: line ([0-9]+): (.*)$`)

// adapt parses the document and builds the whole Caddy config.
func (a *adapter) adapt(body []byte) (map[string]any, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(body, &doc); err != nil {
		if m := yamlLine.FindStringSubmatch(err.Error()); m != nil {
			return nil, fmt.Errorf("%s:%s: %s", a.file, m[1], m[2])
		}
		return nil, fmt.Errorf("%s: %s", a.file, strings.TrimPrefix(err.Error(), "yaml: "))
	}
	root := a.deref(&doc)
	host, port := defaultHost, defaultPort
	var h llmroute.Handler
	if !a.isNull(root) {
		a.warnUnquotedURLs(root, map[*yaml.Node]bool{}, 0)
		top, err := a.pairs(root, "")
		if err != nil {
			return nil, err
		}
		for _, p := range top {
			var err error
			switch p.key.Value {
			case "server":
				host, port, err = a.server(p.val)
			case "providers":
				h.Providers, err = a.providers(p.val)
			case "upstreams":
				h.Upstreams, err = a.upstreams(p.val)
			case "models":
				h.Models, err = a.models(p.val)
			default:
				a.unknownKey(p.key, "")
			}
			if err != nil {
				return nil, err
			}
		}
	}
	if err := a.references(&h); err != nil {
		return nil, err
	}

	handler, err := moduleJSON(&h, "llm_route")
	if err != nil {
		return nil, err
	}
	server := map[string]any{
		"listen":          []string{net.JoinHostPort(host, strconv.Itoa(port))},
		"automatic_https": map[string]any{"disable": true},
		"routes": []any{
			// llm-proxy answered Prometheus scrapes on its own port.
			map[string]any{
				"match":  []any{map[string]any{"path": []string{"/metrics"}}},
				"handle": []any{map[string]any{"handler": "metrics"}},
			},
			// Paths that are not the API's fall through to a 404, as the
			// original answered them.
			map[string]any{"handle": []any{handler, map[string]any{"handler": "static_response", "status_code": 404}}},
		},
	}
	return map[string]any{"apps": map[string]any{"http": map[string]any{
		"servers": map[string]any{"llmproxy": server},
	}}}, nil
}

// moduleJSON is the handler's JSON with `"handler": name` first. Unlike
// caddyconfig.JSONModuleObject it does not pass the object through
// map[string]any, which would round a patch's large integers to float64.
func moduleJSON(h *llmroute.Handler, name string) (json.RawMessage, error) {
	b, err := json.Marshal(h)
	if err != nil {
		return nil, err
	}
	head := fmt.Sprintf(`{"handler":%q`, name)
	if len(b) <= 2 {
		return json.RawMessage(head + "}"), nil
	}
	return json.RawMessage(head + "," + string(b[1:])), nil
}

// unknownKey warns of a key the original would have ignored.
func (a *adapter) unknownKey(k *yaml.Node, path string) {
	a.warn(k, path, "unknown key %q (ignored, as llm-proxy ignores it)", k.Value)
}

// warnUnquotedURLs warns of every unquoted value with "://". llm-proxy's
// YAML parser read such a value as a map (`https:` the key), so its
// documentation requires quotes; this parser reads the string it looks
// like, and the warning keeps the file valid for both.
func (a *adapter) warnUnquotedURLs(n *yaml.Node, seen map[*yaml.Node]bool, depth int) {
	if n == nil || seen[n] || depth > maxDepth {
		return
	}
	seen[n] = true
	check := func(v *yaml.Node) {
		quoted := yaml.DoubleQuotedStyle | yaml.SingleQuotedStyle | yaml.LiteralStyle | yaml.FoldedStyle
		if v.Kind == yaml.ScalarNode && v.Style&quoted == 0 && strings.Contains(v.Value, "://") {
			a.warn(v, "", "unquoted URL %s: llm-proxy reads an unquoted value with \"://\" as a map and needs quotes (%q); read here as the string", v.Value, v.Value)
		}
	}
	switch n.Kind {
	case yaml.MappingNode:
		for i := 1; i < len(n.Content); i += 2 {
			check(n.Content[i])
			a.warnUnquotedURLs(n.Content[i], seen, depth+1)
		}
	case yaml.SequenceNode:
		for _, c := range n.Content {
			check(c)
			a.warnUnquotedURLs(c, seen, depth+1)
		}
	}
}

// server reads the server block: host and port.
func (a *adapter) server(n *yaml.Node) (string, int, error) {
	host, port := defaultHost, defaultPort
	if a.isNull(n) {
		return host, port, nil
	}
	ps, err := a.pairs(n, "server")
	if err != nil {
		return "", 0, err
	}
	for _, p := range ps {
		path := "server." + p.key.Value
		switch p.key.Value {
		case "host":
			h, err := a.str(p.val, path)
			if err != nil {
				return "", 0, err
			}
			if h = strings.Trim(strings.TrimSpace(h), "[]"); h != "" {
				host = h
			}
		case "port":
			v, ok, err := a.integer(p.val, path)
			if err != nil {
				return "", 0, err
			}
			if ok {
				if v < 1 || v > 65535 {
					return "", 0, a.errAt(p.val, path, "want a port from 1 to 65535, got %d", v)
				}
				port = v
			}
		default:
			a.unknownKey(p.key, "server")
		}
	}
	return host, port, nil
}

// entries runs read on each map of the list at n.
func (a *adapter) entries(n *yaml.Node, list string, read func(path string, ps []pair) error) error {
	items, err := a.items(n, list)
	if err != nil {
		return err
	}
	for i, item := range items {
		path := fmt.Sprintf("%s[%d]", list, i)
		ps, err := a.pairs(item, path)
		if err != nil {
			return err
		}
		if err := read(path, ps); err != nil {
			return err
		}
	}
	return nil
}

// required reads a required string field of an entry.
func (a *adapter) required(ps []pair, entry *yaml.Node, path, key string) (string, error) {
	for _, p := range ps {
		if p.key.Value == key {
			s, err := a.str(p.val, path+"."+key)
			if err != nil {
				return "", err
			}
			if strings.TrimSpace(s) == "" {
				return "", a.errAt(p.val, path+"."+key, "must not be empty")
			}
			return s, nil
		}
	}
	return "", a.errAt(entry, path, "%s is required", key)
}

// duration reads an optional ISO-8601 duration field.
func (a *adapter) duration(n *yaml.Node, path string) (*llmroute.Duration, error) {
	if a.isNull(n) {
		return nil, nil
	}
	if n.Kind != yaml.ScalarNode {
		return nil, a.errAt(n, path, "want an ISO-8601 duration (e.g. PT30S), got %s", describe(n))
	}
	d, err := parseDuration(n.Value)
	if err != nil {
		return nil, a.errAt(n, path, "%v", err)
	}
	v := llmroute.Duration(d)
	return &v, nil
}

// patch reads an optional patch map as the JSON object it stands for.
func (a *adapter) patch(n *yaml.Node, path string) (json.RawMessage, error) {
	if a.isNull(n) {
		return nil, nil
	}
	if n.Kind != yaml.MappingNode {
		return nil, a.errAt(n, path, "want a map (merged into the request body), got %s", describe(n))
	}
	return a.toJSON(n, path)
}

// thinkTags reads think_tags as the original did: off, split or strip;
// true is split, false off; empty or unknown is off (an unknown word with
// a warning, where the original said nothing).
func (a *adapter) thinkTags(n *yaml.Node, path string) (llmroute.ThinkTags, error) {
	if a.isNull(n) {
		return "", nil
	}
	if n.Kind != yaml.ScalarNode {
		return "", a.errAt(n, path, "want off, split or strip, got %s", describe(n))
	}
	switch v := strings.ToLower(strings.TrimSpace(n.Value)); v {
	case "off", "split", "strip":
		return llmroute.ThinkTags(v), nil
	case "true":
		return "split", nil
	case "false", "":
		return "off", nil
	}
	a.warn(n, path, "%q is not off, split or strip: off, as llm-proxy reads it", n.Value)
	return "off", nil
}

// dollarRef is the original's environment reference, ${NAME}.
var dollarRef = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)\}`)

// key turns a provider key into the handler's: each ${NAME} becomes the
// Caddy placeholder {env.NAME}, resolved when the config loads, so the
// secret never appears in the adapted JSON; any other brace is escaped so
// it stays literal, as the original kept it.
func (a *adapter) key(n *yaml.Node, path string) (string, error) {
	s, err := a.str(n, path)
	if err != nil || s == "" {
		return s, err
	}
	var b strings.Builder
	last, refs := 0, 0
	literal := func(t string) {
		t = strings.ReplaceAll(t, "{", `\{`)
		b.WriteString(strings.ReplaceAll(t, "}", `\}`))
	}
	for _, m := range dollarRef.FindAllStringSubmatchIndex(s, -1) {
		literal(s[last:m[0]])
		b.WriteString("{env." + s[m[2]:m[3]] + "}")
		last, refs = m[1], refs+1
	}
	literal(s[last:])
	if refs == 0 {
		a.warn(n, path, "the key is written in the file; Caddy shows it in the admin API's GET /config/: use an environment reference, key: \"${NAME}\"")
	}
	return b.String(), nil
}

// text reads an optional string field; ${NAME} outside key is kept as
// written (the original resolves it in keys only), with a warning.
func (a *adapter) text(n *yaml.Node, path string) (string, error) {
	s, err := a.str(n, path)
	if err == nil && dollarRef.MatchString(s) {
		a.warn(n, path, "%q: llm-proxy resolves ${NAME} in key only; kept as written", s)
	}
	return s, err
}

func (a *adapter) providers(n *yaml.Node) ([]llmroute.Provider, error) {
	var out []llmroute.Provider
	err := a.entries(n, "providers", func(path string, ps []pair) error {
		var p llmroute.Provider
		var err error
		for _, f := range ps {
			fp := path + "." + f.key.Value
			switch f.key.Value {
			case "id":
				p.ID, err = a.str(f.val, fp)
			case "url":
				p.URL, err = a.text(f.val, fp)
			case "key":
				p.Key, err = a.key(f.val, fp)
			case "max_concurrency":
				p.MaxConcurrency, err = a.limit(f.val, fp)
			case "patch":
				p.Patch, err = a.patch(f.val, fp)
			case "session_header":
				p.SessionHeader, err = a.text(f.val, fp)
			case "think_tags":
				p.ThinkTags, err = a.thinkTags(f.val, fp)
			case "reasoning_field":
				p.ReasoningField, err = a.text(f.val, fp)
			case "reasoning_empty_ok":
				p.ReasoningEmptyOK, err = a.boolean(f.val, fp)
			case "backoff":
				p.Backoff, err = a.duration(f.val, fp)
			case "first_byte_timeout":
				p.FirstByteTimeout, err = a.duration(f.val, fp)
			case "probe_interval":
				p.ProbeInterval, err = a.duration(f.val, fp)
			default:
				a.unknownKey(f.key, path)
			}
			if err != nil {
				return err
			}
		}
		entry := entryNode(ps)
		if p.ID, err = a.required(ps, entry, path, "id"); err != nil {
			return err
		}
		if p.URL, err = a.required(ps, entry, path, "url"); err != nil {
			return err
		}
		if u, perr := url.Parse(strings.TrimSpace(p.URL)); perr != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return a.errAt(valueOf(ps, "url"), path+".url", "want an http:// or https:// URL, got %q", p.URL)
		}
		a.providerAt = append(a.providerAt, entry)
		out = append(out, p)
		return nil
	})
	return out, err
}

func (a *adapter) upstreams(n *yaml.Node) ([]llmroute.Upstream, error) {
	var out []llmroute.Upstream
	err := a.entries(n, "upstreams", func(path string, ps []pair) error {
		var u llmroute.Upstream
		var zero *yaml.Node
		var err error
		for _, f := range ps {
			fp := path + "." + f.key.Value
			switch f.key.Value {
			case "id", "provider", "model":
				_, err = a.str(f.val, fp) // read below, as required fields
			case "max_concurrency":
				u.MaxConcurrency, err = a.limit(f.val, fp)
				if err == nil && !a.isNull(f.val) && u.MaxConcurrency == 0 {
					zero = f.val
				}
			case "patch":
				u.Patch, err = a.patch(f.val, fp)
			case "think_tags":
				u.ThinkTags, err = a.thinkTags(f.val, fp)
			case "backoff":
				u.Backoff, err = a.duration(f.val, fp)
			case "first_byte_timeout":
				u.FirstByteTimeout, err = a.duration(f.val, fp)
			case "probe_interval":
				u.ProbeInterval, err = a.duration(f.val, fp)
			default:
				a.unknownKey(f.key, path)
			}
			if err != nil {
				return err
			}
		}
		entry := entryNode(ps)
		if u.ID, err = a.required(ps, entry, path, "id"); err != nil {
			return err
		}
		if u.Provider, err = a.required(ps, entry, path, "provider"); err != nil {
			return err
		}
		if u.Model, err = a.required(ps, entry, path, "model"); err != nil {
			return err
		}
		a.upstreamAt = append(a.upstreamAt, entry)
		a.upstreamZero = append(a.upstreamZero, zero)
		out = append(out, u)
		return nil
	})
	return out, err
}

func (a *adapter) models(n *yaml.Node) ([]llmroute.Model, error) {
	var out []llmroute.Model
	err := a.entries(n, "models", func(path string, ps []pair) error {
		var m llmroute.Model
		var refs []*yaml.Node
		var err error
		for _, f := range ps {
			fp := path + "." + f.key.Value
			switch f.key.Value {
			case "name":
				_, err = a.str(f.val, fp)
			case "upstreams":
				var items []*yaml.Node
				if items, err = a.items(f.val, fp); err != nil {
					return err
				}
				for i, it := range items {
					var id string
					if id, err = a.str(it, fmt.Sprintf("%s[%d]", fp, i)); err != nil {
						return err
					}
					m.Upstreams = append(m.Upstreams, id)
					refs = append(refs, it)
				}
			case "patch":
				m.Patch, err = a.patch(f.val, fp)
			default:
				a.unknownKey(f.key, path)
			}
			if err != nil {
				return err
			}
		}
		if m.Name, err = a.required(ps, entryNode(ps), path, "name"); err != nil {
			return err
		}
		a.modelAt = append(a.modelAt, entryNode(ps))
		a.modelRefs = append(a.modelRefs, refs)
		out = append(out, m)
		return nil
	})
	return out, err
}

// limit reads max_concurrency: a whole number, 0 or null for none.
func (a *adapter) limit(n *yaml.Node, path string) (int, error) {
	v, _, err := a.integer(n, path)
	if err == nil && v < 0 {
		return 0, a.errAt(n, path, "must not be negative (0 or null = unlimited)")
	}
	return v, err
}

// valueOf is the value node of key in an entry.
func valueOf(ps []pair, key string) *yaml.Node {
	for _, p := range ps {
		if p.key.Value == key {
			return p.val
		}
	}
	return nil
}

// entryNode is the node to point at for an entry as a whole: its first key.
func entryNode(ps []pair) *yaml.Node {
	if len(ps) == 0 {
		return nil
	}
	return ps[0].key
}

// references checks what entries say of each other. A duplicate id and an
// upstream naming an unknown provider are errors (llm-proxy failed to
// start on the latter); a model's reference to an unknown upstream is a
// warning and left out, as llm-proxy warned and went on.
func (a *adapter) references(h *llmroute.Handler) error {
	providers := map[string]llmroute.Provider{}
	for i, p := range h.Providers {
		if _, dup := providers[p.ID]; dup {
			return a.errAt(a.providerAt[i], fmt.Sprintf("providers[%d]", i), "id %q is used twice", p.ID)
		}
		providers[p.ID] = p
	}
	upstreams := map[string]bool{}
	for i, u := range h.Upstreams {
		path := fmt.Sprintf("upstreams[%d]", i)
		if upstreams[u.ID] {
			return a.errAt(a.upstreamAt[i], path, "id %q is used twice", u.ID)
		}
		upstreams[u.ID] = true
		p, ok := providers[u.Provider]
		if !ok {
			return a.errAt(a.upstreamAt[i], path+".provider", "unknown provider %q", u.Provider)
		}
		if a.upstreamZero[i] != nil && p.MaxConcurrency > 0 {
			a.warn(a.upstreamZero[i], path+".max_concurrency",
				"0 takes provider %q's limit of %d here; for no limit remove the provider's", p.ID, p.MaxConcurrency)
		}
	}
	names := map[string]bool{}
	kept := h.Models[:0]
	for i, m := range h.Models {
		path := fmt.Sprintf("models[%d]", i)
		if names[m.Name] {
			return a.errAt(a.modelAt[i], path, "name %q is used twice", m.Name)
		}
		names[m.Name] = true
		var ids []string
		seen := map[string]bool{}
		for j, id := range m.Upstreams {
			where := fmt.Sprintf("%s.upstreams[%d]", path, j)
			switch {
			case !upstreams[id]:
				a.warn(a.modelRefs[i][j], where, "unknown upstream %q: left out", id)
			case seen[id]:
				a.warn(a.modelRefs[i][j], where, "upstream %q listed twice: the second left out", id)
			default:
				ids = append(ids, id)
			}
			seen[id] = true
		}
		if len(ids) == 0 {
			a.warn(a.modelAt[i], path, "model %q has no upstream: left out (clients get 404 model not found where llm-proxy answered 503)", m.Name)
			continue
		}
		m.Upstreams = ids
		kept = append(kept, m)
	}
	h.Models = kept
	return nil
}
