// Package caddyfile registers the `llm_route` Caddyfile directive and turns
// its tokens into an llmroute.Handler. The handler package never imports it.
package caddyfile

import (
	_ "github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile" // directive registration
	_ "github.com/llm-route/caddy-llm-route/llmroute"
)
