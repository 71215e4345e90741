// Package caddyfile registers the `llm_route` Caddyfile directive and turns
// its tokens into an llmroute.Handler. The handler package never imports it.
//
// The directive only translates syntax: it writes the JSON form of the
// handler (what `caddy adapt` prints) and resolves nothing. Placeholders such
// as `{env.OPENAI_API_KEY}` stay as text and are resolved by the handler at
// provision time; durations and sizes are parsed so that a bad value is an
// error with its file and line. See parseCaddyfile for the grammar.
package caddyfile
