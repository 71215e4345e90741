package integration

import (
	_ "github.com/caddyserver/caddy/v2/caddytest"
	_ "github.com/caddyserver/caddy/v2/modules/standard"
	_ "github.com/llm-route/caddy-llm-route"
)
