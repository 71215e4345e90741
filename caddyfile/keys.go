package caddyfile

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/llm-route/caddy-llm-route/llmroute"
)

// key parses a client key:
//
//	key <id> {
//	    secret          <secret or placeholder>
//	    sha256          <64 hex digits>
//	    models          <name or glob> [...]
//	    rpm             <int>
//	    burst           <int>
//	    tokens_per_day  <int>
//	    spend_per_day   <USD>
//	    spend_per_month <USD>
//	    labels {
//	        <name>      <value>
//	    }
//	}
//
// `models` may be repeated (each line appends); every other setting once.
func (p *parser) key() error {
	d := p.d
	id, err := p.id("key", p.keys)
	if err != nil {
		return err
	}
	k := llmroute.ClientKey{ID: id}
	where := fmt.Sprintf("key %q: ", id)
	seen := settings{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		name := d.Val()
		if name != "models" {
			if err := seen.once(d, where, name); err != nil {
				return err
			}
		}
		switch name {
		case "secret":
			k.Secret, err = p.str(where, name)
		case "sha256":
			k.SHA256, err = p.str(where, name)
		case "models":
			var m []string
			m, err = p.args(where, name, 1, -1)
			k.Models = append(k.Models, m...)
		case "rpm":
			k.RPM, err = p.count64(where, name)
		case "burst":
			k.Burst, err = p.count64(where, name)
		case "tokens_per_day":
			k.TokensPerDay, err = p.count64(where, name)
		case "spend_per_day":
			k.SpendPerDay, err = p.usd(where, name)
		case "spend_per_month":
			k.SpendPerMonth, err = p.usd(where, name)
		case "labels":
			k.Labels, err = p.labels(where)
		default:
			return d.Errf("%sunrecognized subdirective %q", where, name)
		}
		if err != nil {
			return err
		}
	}
	if k.Secret == "" && k.SHA256 == "" {
		return d.Errf("%ssecret or sha256 is required", where)
	}
	p.h.Keys = append(p.h.Keys, k)
	return nil
}

// count64 reads a non-negative integer.
func (p *parser) count64(where, name string) (int64, error) {
	n, err := p.count(where, name)
	return int64(n), err
}

// usd reads a non-negative amount of US dollars (or a price), e.g. 5 or
// 0.15.
func (p *parser) usd(where, name string) (float64, error) {
	s, err := p.str(where, name)
	if err != nil {
		return 0, err
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || v < 0 || v != v {
		return 0, p.d.Errf("%s%s: %q is not a non-negative number of USD", where, name, s)
	}
	return v, nil
}

// labels reads a key's labels block, one `<name> <value>` per line.
func (p *parser) labels(where string) (map[string]string, error) {
	d := p.d
	if d.NextArg() {
		return nil, d.Errf("%slabels: want a block of <name> <value> lines, got argument %q", where, d.Val())
	}
	out := map[string]string{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		name := d.Val()
		args, err := p.args(where+"labels: ", name, 1, 1)
		if err != nil {
			return nil, err
		}
		switch {
		case name == "key":
			return nil, d.Errf("%slabels: %q is set by the router", where, name)
		case strings.ToLower(name) != name:
			return nil, d.Errf("%slabels: name %q must be lower-case", where, name)
		}
		if _, dup := out[name]; dup {
			return nil, d.Errf("%slabels: %q already specified", where, name)
		}
		out[name] = args[0]
	}
	return out, nil
}
