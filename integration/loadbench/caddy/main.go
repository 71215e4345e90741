// Command caddy is the Caddy binary the load benchmark runs twice: once with
// an llm_route config and once with a plain reverse_proxy config, so that
// both proxies are the very same build and differ only in their handler.
//
// It is Caddy's standard main with the standard modules and this repository's
// module plugged in, the same as
//
//	xcaddy build --with github.com/llm-route/caddy-llm-route=.
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/llm-route/caddy-llm-route"
)

func main() {
	caddycmd.Main()
}
