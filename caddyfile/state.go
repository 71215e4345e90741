package caddyfile

import (
	"github.com/llm-route/caddy-llm-route/llmroute"
)

// state parses `state memory` or `state redis { … }`: where the shared
// accounting lives (this process, or a Redis every instance shares).
func (p *parser) state() error {
	d := p.d
	const where = "state: "
	if !d.NextArg() {
		return d.Err("state: want memory or redis")
	}
	st := &llmroute.StateConfig{Backend: d.Val()}
	if st.Backend != "memory" && st.Backend != "redis" {
		return d.Errf("state: backend must be memory or redis, not %q", st.Backend)
	}
	if d.NextArg() {
		return d.Errf("state: unexpected argument %q", d.Val())
	}
	seen := settings{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		name := d.Val()
		if st.Backend == "memory" {
			return d.Errf("state: memory takes no settings (%s)", name)
		}
		if err := seen.once(d, where, name); err != nil {
			return err
		}
		var err error
		switch name {
		case "address":
			st.Address, err = p.str(where, name)
		case "username":
			st.Username, err = p.str(where, name)
		case "password":
			st.Password, err = p.str(where, name)
		case "db":
			st.DB, err = p.count(where, name)
		case "prefix":
			st.Prefix, err = p.str(where, name)
		case "tls":
			st.TLS, err = p.flag(where, name)
		case "timeout":
			st.Timeout, err = p.duration(where, name)
		case "lease_ttl":
			st.LeaseTTL, err = p.duration(where, name)
		case "on_state_error":
			if st.OnStateError, err = p.str(where, name); err == nil &&
				st.OnStateError != "local" && st.OnStateError != "reject" {
				err = d.Errf("state: on_state_error must be local or reject, not %q", st.OnStateError)
			}
		default:
			return d.Errf("state: unrecognized setting %q", name)
		}
		if err != nil {
			return err
		}
	}
	p.h.State = st
	return nil
}
