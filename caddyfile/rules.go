package caddyfile

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/llm-route/caddy-llm-route/llmroute"
)

// rule parses a router model's rule:
//
//	rule <name> {
//	    priority <int>
//	    effort   low|medium|high
//	    match    <attribute> <value> [<value>...]
//	    use      <model> [<model>...]
//	    weights  <int> [<int>...]
//	    shadow   <model> <fraction>
//	}
//
// `match` may be repeated, one attribute per line; every other setting
// once. The models named are checked once the whole directive is read.
func (p *parser) rule(model string, known map[string]int) (llmroute.Rule, error) {
	d := p.d
	var r llmroute.Rule
	if !d.NextArg() {
		return r, d.Errf("model %q: rule: want a name", model)
	}
	r.Name = d.Val()
	if r.Name == "" {
		return r, d.Errf("model %q: rule name must not be empty", model)
	}
	where := fmt.Sprintf("model %q: rule %q: ", model, r.Name)
	if line, dup := known[r.Name]; dup {
		return r, d.Errf("%sduplicate name (first at line %d)", where, line)
	}
	known[r.Name] = d.Line()
	if d.NextArg() {
		return r, d.Errf("%sunexpected argument %q", where, d.Val())
	}
	seen := settings{}
	var err error
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		name := d.Val()
		if name != "match" {
			if err := seen.once(d, where, name); err != nil {
				return r, err
			}
		}
		switch name {
		case "priority":
			var s string
			if s, err = p.str(where, name); err == nil {
				if r.Priority, err = strconv.Atoi(s); err != nil {
					err = d.Errf("%s%s: %q is not an integer", where, name, s)
				}
			}
		case "effort":
			if r.Effort, err = p.str(where, name); err == nil {
				switch r.Effort {
				case "low", "medium", "high":
				default:
					err = d.Errf("%seffort: want low, medium or high, got %q", where, r.Effort)
				}
			}
		case "match":
			var args []string
			if args, err = p.args(where, name, 2, -1); err != nil {
				return r, err
			}
			attr := args[0]
			if strings.ToLower(attr) != attr {
				return r, d.Errf("%smatch %q: attribute names are lower-case (headers are read lower-cased)", where, attr)
			}
			if _, dup := r.Match[attr]; dup {
				return r, d.Errf("%smatch %q: already specified", where, attr)
			}
			if r.Match == nil {
				r.Match = map[string]llmroute.StringList{}
			}
			r.Match[attr] = args[1:]
		case "use":
			var ms []string
			if ms, err = p.args(where, name, 1, -1); err != nil {
				return r, err
			}
			listed := map[string]bool{}
			for _, m := range ms {
				if listed[m] {
					return r, d.Errf("%suse: model %q listed twice", where, m)
				}
				listed[m] = true
				p.refs = append(p.refs, reference{model: true, id: m,
					err:       d.Errf("%suse: unknown model %q", where, m),
					routerErr: d.Errf("%suse: %q is a router model; a rule's chain names plain models", where, m)})
			}
			r.Use = ms
		case "weights":
			var ws []string
			if ws, err = p.args(where, name, 1, -1); err != nil {
				return r, err
			}
			for _, w := range ws {
				n, aerr := strconv.Atoi(w)
				if aerr != nil || n < 0 || n > math.MaxUint32 {
					return r, d.Errf("%sweights: %q is not a non-negative integer", where, w)
				}
				r.Weights = append(r.Weights, n)
			}
		case "shadow":
			var args []string
			if args, err = p.args(where, name, 2, 2); err != nil {
				return r, err
			}
			f, ferr := strconv.ParseFloat(args[1], 64)
			if ferr != nil || !(f >= 0 && f <= 1) {
				return r, d.Errf("%sshadow: fraction must be between 0 and 1, got %q", where, args[1])
			}
			r.Shadow = &llmroute.Shadow{Model: args[0], Fraction: f}
			p.refs = append(p.refs, reference{model: true, id: args[0],
				err:       d.Errf("%sshadow: unknown model %q", where, args[0]),
				routerErr: d.Errf("%sshadow: %q is a router model", where, args[0])})
		default:
			return r, d.Errf("%sunrecognized subdirective %q", where, name)
		}
		if err != nil {
			return r, err
		}
	}
	if len(r.Use) == 0 {
		return r, d.Errf("%suse: needs at least one model", where)
	}
	if len(r.Weights) > 0 && len(r.Weights) != len(r.Use) {
		return r, d.Errf("%sweights: want one per model in use (%d), got %d", where, len(r.Use), len(r.Weights))
	}
	return r, nil
}

// judge parses `judge <model> [<deadline>]`.
func (p *parser) judge(model string) (*llmroute.Judge, error) {
	d := p.d
	where := fmt.Sprintf("model %q: ", model)
	args, err := p.args(where, "judge", 1, 2)
	if err != nil {
		return nil, err
	}
	j := &llmroute.Judge{Model: args[0]}
	p.refs = append(p.refs, reference{model: true, id: args[0],
		err:       d.Errf("%sjudge: unknown model %q", where, args[0]),
		routerErr: d.Errf("%sjudge: %q is a router model", where, args[0])})
	if len(args) == 2 {
		v, perr := llmroute.ParseDuration(args[1])
		if perr != nil {
			return nil, d.Errf("%sjudge: deadline: %v", where, perr)
		}
		dur := llmroute.Duration(v)
		j.Deadline = &dur
	}
	return j, nil
}
