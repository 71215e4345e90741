package integration

// Issue #10 item 15: a provider's `transport` is Caddy's own
// http.reverse_proxy.transport.http module.

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig"
)

// tlsUpstream is a provider behind HTTPS with httptest's self-signed
// certificate (for 127.0.0.1), which no system trust store knows. failNext
// makes it answer 500 to the next POST once (not to the GET …/models that
// each config's start-up path check sends at a time of its own).
type tlsUpstream struct {
	*httptest.Server
	failNext atomic.Bool
}

func newTLSUpstream(t *testing.T) *tlsUpstream {
	t.Helper()
	u := &tlsUpstream{}
	u.Server = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && u.failNext.CompareAndSwap(true, false) {
			status(500)(w, r)
			return
		}
		completion("over tls")(w, r)
	}))
	t.Cleanup(u.Close)
	return u
}

// tlsConfig is one provider at base with the given transport (nil = none).
func tlsConfig(base string, transport map[string]any, extra ...any) map[string]any {
	prov := obj(append([]any{"id", "tp", "url", base}, extra...)...)
	if transport != nil {
		prov["transport"] = transport
	}
	return cfg(
		[]map[string]any{prov},
		[]map[string]any{obj("id", "tu", "provider", "tp", "model", "x")},
		[]map[string]any{obj("name", "tm", "upstreams", []string{"tu"})},
	)
}

// writePEM writes a certificate to a PEM file and returns its path.
func writePEM(t *testing.T, der []byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// unrelatedCA makes a self-signed CA certificate that signed nothing.
func unrelatedCA(t *testing.T) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "unrelated test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

func TestProviderTransportTLS(t *testing.T) {
	srv := newTLSUpstream(t)
	base := srv.URL + "/v1"
	ok := func(t *testing.T, p *proxy, stream bool) {
		t.Helper()
		resp := p.chat(chatBody("tm", stream))
		if body := readAll(t, resp); resp.StatusCode != http.StatusOK || !strings.Contains(body, "over") {
			t.Fatalf("stream=%v: status %d body %s", stream, resp.StatusCode, body)
		}
	}

	// Without a transport the default one verifies against the system's
	// CAs, and the self-signed upstream fails.
	p := startProxy(t, tlsConfig(base, nil))
	expectAPIError(t, p.chat(chatBody("tm", false)), http.StatusServiceUnavailable, "all_upstreams_failed")

	t.Run("tls_insecure_skip_verify", func(t *testing.T) {
		p.load(tlsConfig(base, obj("protocol", "http", "tls", obj("insecure_skip_verify", true))))
		ok(t, p, false)
		ok(t, p, true)
	})

	t.Run("private CA from a file", func(t *testing.T) {
		trusted := writePEM(t, srv.Certificate().Raw)
		p.load(tlsConfig(base, obj("protocol", "http",
			"tls", obj("ca", obj("provider", "file", "pem_files", []string{trusted})))))
		ok(t, p, false)

		// A trust pool without the upstream's CA refuses it.
		other := writePEM(t, unrelatedCA(t))
		p.load(tlsConfig(base, obj("protocol", "http",
			"tls", obj("ca", obj("provider", "file", "pem_files", []string{other})))))
		expectAPIError(t, p.chat(chatBody("tm", false)), http.StatusServiceUnavailable, "all_upstreams_failed")
	})

	t.Run("probes use the transport", func(t *testing.T) {
		p.load(tlsConfig(base, obj("protocol", "http", "tls", obj("insecure_skip_verify", true)),
			"backoff", "1m", "probe_interval", "50ms"))
		probes := func() float64 {
			return p.metric("llm_proxy_probe_pings_total", "upstream", "tu", "provider", "tp", "result", "ok")
		}
		before := probes()
		srv.failNext.Store(true)
		expectAPIError(t, p.chat(chatBody("tm", false)), http.StatusServiceUnavailable, "all_upstreams_failed")
		eventually(t, 10*time.Second, "a successful probe over TLS", func() bool { return probes() > before })
		ok(t, p, false)
	})

	t.Run("Caddyfile transport http block", func(t *testing.T) {
		caddyfileText := fmt.Sprintf(`{
	admin 127.0.0.1:%d
	auto_https off
}
http://127.0.0.1:%d {
	llm_route {
		provider tp {
			url %s
			transport http {
				tls_insecure_skip_verify
			}
		}
		upstream tu tp x
		model tm tu
	}
}
`, p.aport, p.port, base)
		adapted, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfileText), nil)
		if err != nil {
			t.Fatalf("adapt: %v", err)
		}
		if err := loadCaddy(t, adapted); err != nil {
			t.Fatalf("load: %v", err)
		}
		ok(t, p, true)
		// The same Caddyfile without the option fails.
		adapted, _, err = caddyconfig.GetAdapter("caddyfile").Adapt(
			[]byte(strings.Replace(caddyfileText, "tls_insecure_skip_verify", "dial_timeout 5s", 1)), nil)
		if err != nil {
			t.Fatalf("adapt: %v", err)
		}
		if err := loadCaddy(t, adapted); err != nil {
			t.Fatalf("load: %v", err)
		}
		expectAPIError(t, p.chat(chatBody("tm", false)), http.StatusServiceUnavailable, "all_upstreams_failed")
	})

	t.Run("a TLS transport on an http url is refused", func(t *testing.T) {
		err := p.loadErr(tlsConfig("http://127.0.0.1:1/v1", obj("protocol", "http", "tls", obj())))
		if err == nil || !strings.Contains(err.Error(), `provider "tp"`) || !strings.Contains(err.Error(), "http://") {
			t.Errorf("load error %v, want one naming provider tp and the http:// url", err)
		}
	})

	t.Run("an unknown transport module is refused", func(t *testing.T) {
		err := p.loadErr(tlsConfig(base, obj("protocol", "carrier_pigeon")))
		if err == nil || !strings.Contains(err.Error(), `provider "tp"`) || !strings.Contains(err.Error(), "carrier_pigeon") {
			t.Errorf("load error %v, want one naming provider tp and the module", err)
		}
	})
}
