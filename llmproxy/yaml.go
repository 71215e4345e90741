package llmproxy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Bounds on what one config may expand to. YAML aliases can refer to an
// ancestor (a cycle) or multiply a small file into a huge tree; the
// adapter refuses such input instead of looping or exhausting memory.
const (
	maxDepth = 64
	maxNodes = 1 << 17
)

// pair is one key and its value in a YAML map, aliases resolved.
type pair struct {
	key, val *yaml.Node
}

// deref follows aliases (and a document node) to the node they stand for.
func (a *adapter) deref(n *yaml.Node) *yaml.Node {
	for i := 0; n != nil && i < maxDepth; i++ {
		switch n.Kind {
		case yaml.AliasNode:
			n = n.Alias
		case yaml.DocumentNode:
			if len(n.Content) == 0 {
				return nil
			}
			n = n.Content[0]
		case 0: // an empty document
			return nil
		default:
			return n
		}
	}
	return n
}

// isNull reports whether n is absent or YAML null (`~`, `null`, nothing).
func (a *adapter) isNull(n *yaml.Node) bool {
	n = a.deref(n)
	return n == nil || n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}

// pairs returns the entries of the map n in document order, with YAML
// merge keys (`<<: *base`) expanded: a key written in the map wins over a
// merged one, and of merged maps the first listed wins. A key written
// twice is an error, as a later one would silently hide the first.
func (a *adapter) pairs(n *yaml.Node, path string) ([]pair, error) {
	return a.pairsDepth(n, path, 0)
}

func (a *adapter) pairsDepth(n *yaml.Node, path string, depth int) ([]pair, error) {
	n = a.deref(n)
	if depth > maxDepth {
		return nil, a.errAt(n, path, "merge keys nested too deep")
	}
	if n == nil || n.Kind != yaml.MappingNode {
		return nil, a.errAt(n, path, "want a map, got %s", describe(n))
	}
	var out, merged []pair
	seen := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind == yaml.ScalarNode && k.ShortTag() == "!!merge" {
			sources := []*yaml.Node{a.deref(v)}
			if s := a.deref(v); s != nil && s.Kind == yaml.SequenceNode {
				sources = s.Content
			}
			for _, src := range sources {
				ps, err := a.pairsDepth(src, path, depth+1)
				if err != nil {
					return nil, err
				}
				merged = append(merged, ps...)
			}
			continue
		}
		if k.Kind != yaml.ScalarNode {
			return nil, a.errAt(k, path, "a key must be a plain word, got %s", describe(k))
		}
		if line, dup := seen[k.Value]; dup {
			return nil, a.errAt(k, joinPath(path, k.Value), "written twice (first on line %d)", line)
		}
		seen[k.Value] = k.Line
		out = append(out, pair{k, a.deref(v)})
	}
	for _, p := range merged {
		if _, ok := seen[p.key.Value]; !ok {
			seen[p.key.Value] = p.key.Line
			out = append(out, p)
		}
	}
	return out, nil
}

// items returns the entries of the list n; null is an empty list.
func (a *adapter) items(n *yaml.Node, path string) ([]*yaml.Node, error) {
	n = a.deref(n)
	if a.isNull(n) {
		return nil, nil
	}
	if n.Kind != yaml.SequenceNode {
		return nil, a.errAt(n, path, "want a list, got %s", describe(n))
	}
	out := make([]*yaml.Node, len(n.Content))
	for i, c := range n.Content {
		out[i] = a.deref(c)
	}
	return out, nil
}

// str reads a scalar as text; null is "". A number (`model: 4`) is its
// text, as written.
func (a *adapter) str(n *yaml.Node, path string) (string, error) {
	n = a.deref(n)
	if a.isNull(n) {
		return "", nil
	}
	if n.Kind != yaml.ScalarNode {
		if n.Kind == yaml.MappingNode && len(n.Content) > 0 && strings.HasPrefix(n.Content[0].Value, "http") {
			// llm-proxy's own pitfall, in the one form this parser shares.
			return "", a.errAt(n, path, "want a string, got a map: quote URLs (url: \"https://…\")")
		}
		return "", a.errAt(n, path, "want a string, got %s", describe(n))
	}
	return n.Value, nil
}

// integer reads a whole number; null is absent (ok false).
func (a *adapter) integer(n *yaml.Node, path string) (v int, ok bool, err error) {
	n = a.deref(n)
	if a.isNull(n) {
		return 0, false, nil
	}
	if n.Kind == yaml.ScalarNode {
		var i int64
		if n.ShortTag() == "!!int" && n.Decode(&i) == nil && i >= math.MinInt32 && i <= math.MaxInt32 {
			return int(i), true, nil
		}
		if i, perr := strconv.ParseInt(strings.TrimSpace(n.Value), 10, 32); perr == nil {
			return int(i), true, nil // a quoted number, "4"
		}
	}
	return 0, false, a.errAt(n, path, "want a whole number, got %s", describe(n))
}

// boolean reads true or false; null is false.
func (a *adapter) boolean(n *yaml.Node, path string) (bool, error) {
	n = a.deref(n)
	if a.isNull(n) {
		return false, nil
	}
	var b bool
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!bool" && n.Decode(&b) == nil {
		return b, nil
	}
	return false, a.errAt(n, path, "want true or false, got %s", describe(n))
}

// toJSON renders a YAML value as JSON, map keys in document order: a
// patch is written as a native YAML map and merged into request bodies
// as the JSON object it stands for.
func (a *adapter) toJSON(n *yaml.Node, path string) (json.RawMessage, error) {
	var buf bytes.Buffer
	if err := a.writeJSON(&buf, n, path, 0); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func (a *adapter) writeJSON(buf *bytes.Buffer, n *yaml.Node, path string, depth int) error {
	n = a.deref(n)
	a.nodes++
	if depth > maxDepth || a.nodes > maxNodes {
		return a.errAt(n, path, "nested too deep or too large (aliases expand too far)")
	}
	if n == nil {
		buf.WriteString("null")
		return nil
	}
	switch n.Kind {
	case yaml.MappingNode:
		ps, err := a.pairs(n, path)
		if err != nil {
			return err
		}
		buf.WriteByte('{')
		for i, p := range ps {
			if i > 0 {
				buf.WriteByte(',')
			}
			k, _ := json.Marshal(p.key.Value)
			buf.Write(k)
			buf.WriteByte(':')
			if err := a.writeJSON(buf, p.val, joinPath(path, p.key.Value), depth+1); err != nil {
				return err
			}
		}
		buf.WriteByte('}')
	case yaml.SequenceNode:
		buf.WriteByte('[')
		for i, c := range n.Content {
			if i > 0 {
				buf.WriteByte(',')
			}
			if err := a.writeJSON(buf, c, fmt.Sprintf("%s[%d]", path, i), depth+1); err != nil {
				return err
			}
		}
		buf.WriteByte(']')
	case yaml.ScalarNode:
		v, err := a.scalar(n, path)
		if err != nil {
			return err
		}
		b, err := json.Marshal(v)
		if err != nil {
			return a.errAt(n, path, "%v", err)
		}
		buf.Write(b)
	default:
		return a.errAt(n, path, "unexpected %s", describe(n))
	}
	return nil
}

// scalar is the JSON value of a YAML scalar by its resolved tag; every
// other tag (timestamps, custom tags) is the text as written.
func (a *adapter) scalar(n *yaml.Node, path string) (any, error) {
	switch n.ShortTag() {
	case "!!null":
		return nil, nil
	case "!!bool":
		var b bool
		if err := n.Decode(&b); err == nil {
			return b, nil
		}
	case "!!int":
		var i int64
		if err := n.Decode(&i); err == nil {
			return i, nil
		}
		var u uint64
		if err := n.Decode(&u); err == nil {
			return u, nil
		}
	case "!!float":
		var f float64
		if err := n.Decode(&f); err == nil {
			if math.IsNaN(f) || math.IsInf(f, 0) {
				return nil, a.errAt(n, path, "%s has no JSON form", n.Value)
			}
			return f, nil
		}
	}
	return n.Value, nil
}

// describe names the kind of a node for an error message.
func describe(n *yaml.Node) string {
	if n == nil || n.Kind == 0 {
		return "nothing"
	}
	switch n.Kind {
	case yaml.MappingNode:
		return "a map"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		if n.ShortTag() == "!!null" {
			return "null"
		}
		return strconv.Quote(n.Value)
	}
	return "an alias"
}

// joinPath appends a map key to a config path: providers[0] + url.
func joinPath(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}
