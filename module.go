// Package caddyllmroute plugs the llm_route handler and its Caddyfile
// directive into Caddy. Build a Caddy with it:
//
//	xcaddy build --with github.com/llm-route/caddy-llm-route
//
// The handler lives in package llmroute, the directive in package caddyfile,
// the llm-proxy config adapter in package llmproxy; this package only imports
// them so that one --with brings in everything.
package caddyllmroute

import (
	// The Caddyfile directive `llm_route` (it imports the handler too).
	_ "github.com/llm-route/caddy-llm-route/caddyfile"
	// The http.handlers.llm_route module.
	_ "github.com/llm-route/caddy-llm-route/llmroute"
	// The `caddy llm-route status|explain` commands.
	_ "github.com/llm-route/caddy-llm-route/llmroute/cli"
	// The config adapter `llmproxy`: llm-proxy's config.yaml as it is.
	_ "github.com/llm-route/caddy-llm-route/llmproxy"
)
