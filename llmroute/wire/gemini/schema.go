package gemini

import (
	"bytes"

	"github.com/llm-route/caddy-llm-route/llmroute/internal/jsonscan"
)

// Gemini accepts two schema dialects: JSON Schema (parametersJsonSchema,
// responseJsonSchema) and its own OpenAPI-style Schema (parameters,
// responseSchema) with upper-case type names, nullable, propertyOrdering
// and int64 limits written as strings. Clients mix them (Gemini CLI sends
// "type":"OBJECT" inside responseJsonSchema), and llama.cpp's grammar builder
// and OpenAI reject the upper-case forms, so both are normalized to JSON
// Schema: only these spots change, every other byte is copied as sent.

// schemaMarkers are substrings without which a schema needs no change; a
// schema holding none of them is copied whole. "\\u" catches escaped keys.
var schemaMarkers = [...][]byte{
	[]byte(`"nullable"`), []byte(`"propertyOrdering"`), []byte(`"TYPE_UNSPECIFIED"`),
	[]byte(`"STRING"`), []byte(`"NUMBER"`), []byte(`"INTEGER"`), []byte(`"BOOLEAN"`),
	[]byte(`"ARRAY"`), []byte(`"OBJECT"`), []byte(`"NULL"`),
	[]byte(`Items"`), []byte(`Length"`), []byte(`Properties"`), []byte(`\u`),
}

func needsNormalizing(v []byte) bool {
	for _, m := range schemaMarkers {
		if bytes.Contains(v, m) {
			return true
		}
	}
	return false
}

// appendSchema appends the schema object v in JSON Schema form.
func appendSchema(dst, v []byte) []byte {
	if !needsNormalizing(v) {
		return append(dst, v...)
	}
	return appendSchemaValue(dst, v, 0)
}

// maxSchemaDepth bounds recursion on hostile input; deeper parts are copied
// as they are.
const maxSchemaDepth = 64

// appendSchemaValue appends a schema (an object; booleans and anything else
// are copied). An object that needs no change is copied whole, white space
// included.
func appendSchemaValue(dst, v []byte, depth int) []byte {
	if v[0] != '{' || depth > maxSchemaDepth || !schemaChanges(v, depth) {
		return append(dst, v...)
	}
	// First pass: the type and nullable, which change together.
	var typ []byte
	nullable := false
	it := jsonscan.IterObject(v, 0, false)
	var m jsonscan.Member
	var tmp [32]byte
	for it.Next(&m) {
		switch string(jsonscan.KeyOf(v, &m, tmp[:])) {
		case "type":
			typ = v[m.Vs:m.Ve]
		case "nullable":
			nullable = string(v[m.Vs:m.Ve]) == "true"
		}
	}
	var lt [32]byte
	ltype := lowerType(lt[:0], typ) // nil: drop the member; typ itself when not a string
	dst = append(dst, '{')
	start := len(dst)
	it = jsonscan.IterObject(v, 0, false)
	for it.Next(&m) {
		val := v[m.Vs:m.Ve]
		key := jsonscan.KeyOf(v, &m, tmp[:])
		switch string(key) {
		case "nullable", "propertyOrdering", "property_ordering":
			continue
		case "type":
			if ltype == nil {
				continue
			}
		}
		if len(dst) > start {
			dst = append(dst, ',')
		}
		dst = append(dst, '"')
		dst = append(dst, v[m.Ks:m.Ke]...)
		dst = append(dst, `":`...)
		switch string(key) {
		case "type":
			if nullable && ltype[0] == '"' && string(ltype) != `"null"` {
				dst = append(dst, '[')
				dst = append(dst, ltype...)
				dst = append(dst, `,"null"]`...)
			} else {
				dst = append(dst, ltype...)
			}
		case "properties", "$defs", "definitions", "patternProperties", "dependentSchemas":
			dst = appendSchemaMap(dst, val, depth+1)
		case "items", "additionalProperties", "not", "if", "then", "else", "contains",
			"propertyNames", "unevaluatedItems", "unevaluatedProperties", "additionalItems":
			if val[0] == '[' { // draft-4 tuple items
				dst = appendSchemaList(dst, val, depth+1)
			} else {
				dst = appendSchemaValue(dst, val, depth+1)
			}
		case "anyOf", "oneOf", "allOf", "prefixItems":
			dst = appendSchemaList(dst, val, depth+1)
		case "minItems", "maxItems", "minLength", "maxLength", "minProperties", "maxProperties":
			// Google's int64 fields arrive as strings in its own Schema.
			if d := digits(val); d != nil {
				dst = append(dst, d...)
			} else {
				dst = append(dst, val...)
			}
		default:
			dst = append(dst, val...)
		}
	}
	return append(dst, '}')
}

// schemaChanges reports whether appendSchemaValue would change the schema
// v (or one nested in it).
func schemaChanges(v []byte, depth int) bool {
	if v[0] != '{' || depth > maxSchemaDepth {
		return false
	}
	changed := false
	it := jsonscan.IterObject(v, 0, false)
	var m jsonscan.Member
	var tmp [32]byte
	for it.Next(&m) && !changed {
		val := v[m.Vs:m.Ve]
		switch string(jsonscan.KeyOf(v, &m, tmp[:])) {
		case "nullable", "propertyOrdering", "property_ordering":
			changed = true
		case "type":
			var lt [32]byte
			l := lowerType(lt[:0], val)
			changed = l == nil || string(l) != string(val)
		case "properties", "$defs", "definitions", "patternProperties", "dependentSchemas":
			if val[0] == '{' {
				jsonscan.EachMember(val, 0, func(_ []byte, vs, ve int) bool {
					changed = schemaChanges(val[vs:ve], depth+1)
					return !changed
				})
			}
		case "items", "additionalProperties", "not", "if", "then", "else", "contains",
			"propertyNames", "unevaluatedItems", "unevaluatedProperties", "additionalItems",
			"anyOf", "oneOf", "allOf", "prefixItems":
			if val[0] == '[' {
				jsonscan.EachElem(val, 0, func(vs, ve int) bool {
					changed = schemaChanges(val[vs:ve], depth+1)
					return !changed
				})
			} else {
				changed = schemaChanges(val, depth+1)
			}
		case "minItems", "maxItems", "minLength", "maxLength", "minProperties", "maxProperties":
			changed = digits(val) != nil
		}
	}
	return changed
}

// appendSchemaMap appends an object whose values are schemas.
func appendSchemaMap(dst, v []byte, depth int) []byte {
	if v[0] != '{' {
		return append(dst, v...)
	}
	dst = append(dst, '{')
	start := len(dst)
	it := jsonscan.IterObject(v, 0, false)
	var m jsonscan.Member
	for it.Next(&m) {
		if len(dst) > start {
			dst = append(dst, ',')
		}
		dst = append(dst, '"')
		dst = append(dst, v[m.Ks:m.Ke]...)
		dst = append(dst, `":`...)
		dst = appendSchemaValue(dst, v[m.Vs:m.Ve], depth)
	}
	return append(dst, '}')
}

// appendSchemaList appends an array of schemas.
func appendSchemaList(dst, v []byte, depth int) []byte {
	if v[0] != '[' {
		return appendSchemaValue(dst, v, depth)
	}
	dst = append(dst, '[')
	start := len(dst)
	jsonscan.EachElem(v, 0, func(vs, ve int) bool {
		if len(dst) > start {
			dst = append(dst, ',')
		}
		dst = appendSchemaValue(dst, v[vs:ve], depth)
		return true
	})
	return append(dst, ']')
}

// lowerType returns the JSON Schema form of a "type" value: Google's
// upper-case names lower-cased (TYPE_UNSPECIFIED → nil, the member is
// dropped); anything else as it is. An array of type names has each
// upper-case name lower-cased.
func lowerType(buf, typ []byte) []byte {
	if typ == nil {
		return nil
	}
	if typ[0] == '[' {
		out := append(buf, '[')
		start := len(out)
		jsonscan.EachElem(typ, 0, func(vs, ve int) bool {
			e := lowerType(nil, typ[vs:ve])
			if e == nil {
				return true
			}
			if len(out) > start {
				out = append(out, ',')
			}
			out = append(out, e...)
			return true
		})
		return append(out, ']')
	}
	if typ[0] != '"' {
		return typ
	}
	switch string(typ) {
	case `"TYPE_UNSPECIFIED"`:
		return nil
	case `"STRING"`, `"NUMBER"`, `"INTEGER"`, `"BOOLEAN"`, `"ARRAY"`, `"OBJECT"`, `"NULL"`:
		return append(buf, bytes.ToLower(typ)...)
	}
	return typ
}

// digits returns the digits of a JSON string holding only digits, else nil.
func digits(v []byte) []byte {
	if len(v) < 3 || v[0] != '"' {
		return nil
	}
	d := v[1 : len(v)-1]
	for _, c := range d {
		if c < '0' || c > '9' {
			return nil
		}
	}
	return d
}
