package webhook_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/webhook"
)

// testResolver answers from a fixed table, as a hostile DNS server would.
type testResolver map[string][]netip.Addr

func (r testResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if a, ok := r[host]; ok {
		return a, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

// recorder is a listener that counts every connection made to it.
type recorder struct {
	ln      net.Listener
	accepts atomic.Int64
}

func listenRecorder(t *testing.T, addr string) *recorder {
	t.Helper()
	ln, err := (&net.ListenConfig{}).Listen(t.Context(), "tcp", addr)
	require.NoError(t, err)
	r := &recorder{ln: ln}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			r.accepts.Add(1)
			_ = c.Close()
		}
	}()
	return r
}

func (r *recorder) port() string {
	_, port, _ := net.SplitHostPort(r.ln.Addr().String())
	return port
}

func TestClientRefusesHostileTargetsBeforeConnecting(t *testing.T) {
	t.Parallel()
	rec := listenRecorder(t, "127.0.0.1:0")
	port := rec.port()

	// A server the client is allowed to reach (127.0.0.3 only) that
	// redirects to the recorder and to the cloud metadata address.
	redirectLn, err := (&net.ListenConfig{}).Listen(t.Context(), "tcp", "127.0.0.3:0")
	require.NoError(t, err)
	redirector := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, r.URL.Query().Get("to"), http.StatusTemporaryRedirect)
	}))
	redirector.Listener = redirectLn
	redirector.Start()
	t.Cleanup(redirector.Close)

	resolver := testResolver{
		"loopback.test": {netip.MustParseAddr("127.0.0.1")},
		"metadata.test": {netip.MustParseAddr("169.254.169.254")},
		"mapped.test":   {netip.MustParseAddr("::ffff:127.0.0.1")},
		"private.test":  {netip.MustParseAddr("10.1.2.3")},
		// One public address does not launder an internal one.
		"mixed.test": {netip.MustParseAddr("93.184.216.34"), netip.MustParseAddr("127.0.0.1")},
	}
	client, err := webhook.NewClient(webhook.ClientConfig{
		AllowHTTP: true, // the targets are refused for their address, not their scheme
		Allow:     []netip.Prefix{netip.MustParsePrefix("127.0.0.3/32")},
		Resolver:  resolver,
	})
	require.NoError(t, err)
	dials := webhook.CountDials(client)

	hostile := []string{
		"127.0.0.1", "127.1.2.3", "[::1]", "[::ffff:127.0.0.1]", "[::ffff:7f00:1]", "[::127.0.0.1]",
		"0.0.0.0", "[::]", "0.1.2.3",
		"2130706433", "0177.0.0.1", "0x7f.0.0.1", "0x7f000001", "127.1", "017700000001",
		"10.0.0.1", "172.16.0.1", "172.31.255.255", "192.168.1.1", "[fc00::1]", "[fd12:3456::1]",
		"169.254.169.254", "[fe80::1]", "[fe80::1%25lo]",
		"100.64.0.1", "100.127.255.254",
		"198.18.0.1", "198.19.255.255",
		"224.0.0.1", "239.255.255.250", "[ff02::1]",
		"240.0.0.1", "255.255.255.255", "192.0.0.1", "192.0.2.1", "198.51.100.1", "203.0.113.1", "[2001:db8::1]",
		"[64:ff9b::7f00:1]", "[64:ff9b::a9fe:a9fe]", "[2002:7f00:1::1]", "[2001::1]",
		"[::ffff:10.0.0.1]", "[::ffff:169.254.169.254]",
		"loopback.test", "metadata.test", "mapped.test", "private.test", "mixed.test",
	}
	require.GreaterOrEqual(t, len(hostile), 30)
	for _, host := range hostile {
		_, err := client.Post(t.Context(), "http://"+host+":"+port+"/hook", nil, []byte(`{}`))
		require.ErrorIs(t, err, webhook.ErrForbiddenAddress, host)
		var ae *webhook.AddressError
		require.ErrorAs(t, err, &ae, host)
	}
	for _, to := range []string{"http://127.0.0.1:" + port + "/", "http://169.254.169.254/latest/meta-data/"} {
		resp, err := client.Post(t.Context(), redirector.URL+"/?to="+to, nil, []byte(`{}`))
		require.NoError(t, err, "the redirect itself is the response")
		require.Equal(t, http.StatusTemporaryRedirect, resp.Status, "redirects are not followed")
	}
	// Only the allowed redirector was dialled (once, or twice if its
	// keep-alive connection was not reused).
	require.Positive(t, dials.Load())
	require.LessOrEqual(t, dials.Load(), int64(2))
	require.Zero(t, rec.accepts.Load(), "no connection reached the internal listener")
}

func TestClientControlHookRefusesAtDialTime(t *testing.T) {
	t.Parallel()
	client, err := webhook.NewClient(webhook.ClientConfig{})
	require.NoError(t, err)
	for _, addr := range []string{"127.0.0.1:443", "[::1]:443", "[::ffff:127.0.0.1]:443", "169.254.169.254:80", "10.0.0.1:443", "[64:ff9b::a00:1]:443", "0.0.0.0:443"} {
		require.ErrorIs(t, webhook.Control(client, addr), webhook.ErrForbiddenAddress, addr)
	}
	for _, addr := range []string{"93.184.216.34:443", "[2606:2800:220:1:248:1893:25c8:1946]:443"} {
		require.NoError(t, webhook.Control(client, addr), addr)
	}
}

func TestClientRequiresTLSUnlessAllowed(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) }))
	t.Cleanup(srv.Close)
	strict, err := webhook.NewClient(webhook.ClientConfig{Allow: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}})
	require.NoError(t, err)
	_, err = strict.Post(t.Context(), srv.URL, nil, nil)
	require.ErrorIs(t, err, webhook.ErrInsecureURL)

	for _, bad := range []string{"ftp://example.com/", "https://user:pw@example.com/", "https:///path", "://"} {
		_, err = strict.CheckURL(bad)
		require.ErrorIs(t, err, webhook.ErrInvalidURL, bad)
	}
}

func TestClientReadsALimitedResponse(t *testing.T) {
	t.Parallel()
	big := make([]byte, 1<<20)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Echo", r.Header.Get("X-Test"))
		_, _ = w.Write(big)
	}))
	t.Cleanup(srv.Close)
	client, err := webhook.NewClient(webhook.ClientConfig{
		AllowHTTP: true, MaxResponseBytes: 100,
		Allow: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")},
	})
	require.NoError(t, err)
	resp, err := client.Post(t.Context(), srv.URL, http.Header{"X-Test": {"yes"}}, []byte(`{}`))
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.Status)
	require.Equal(t, "yes", resp.Header.Get("X-Echo"), "the caller's headers are sent")
	require.Len(t, resp.Body, 100)
	require.Positive(t, resp.Latency)
}

func TestClientConfigIsValidated(t *testing.T) {
	t.Parallel()
	for _, cfg := range []webhook.ClientConfig{{AttemptTimeout: -1}, {MaxResponseBytes: -1}, {Allow: []netip.Prefix{{}}}} {
		_, err := webhook.NewClient(cfg)
		require.ErrorIs(t, err, webhook.ErrInvalidConfig)
		require.NotErrorIs(t, err, webhook.ErrForbiddenAddress)
	}
}

// FuzzCheckURL feeds arbitrary URLs to the client's URL check: it never
// panics, and a URL it accepts with an address for a host names a public
// address that the dial-time check also lets through.
func FuzzCheckURL(f *testing.F) {
	for _, seed := range []string{
		"https://erp.example.com/hook", "http://127.0.0.1:8080/", "https://[::ffff:127.0.0.1]/", "https://2130706433/",
		"https://0177.0.0.1/", "https://0x7f.1/", "https://93.184.216.34/", "https://[2606:2800:220:1::1]/",
		"https://[fe80::1%25eth0]/", "https://user@host/", "ftp://x/", "https://%zz/", "",
	} {
		f.Add(seed)
	}
	client, err := webhook.NewClient(webhook.ClientConfig{AllowHTTP: true})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		u, err := client.CheckURL(raw)
		if err != nil {
			return
		}
		if a, perr := netip.ParseAddr(u.Hostname()); perr == nil {
			if cerr := webhook.Control(client, netip.AddrPortFrom(a, 443).String()); cerr != nil {
				t.Fatalf("accepted %q, whose address %s the dialer refuses: %v", raw, a, cerr)
			}
		}
	})
}

// Go's resolver answers with the IPv4 entries of /etc/hosts (Docker's
// --add-host, Kubernetes hostAliases) in IPv4-mapped form. The client judges
// such an answer as the IPv4 address it maps: a public one is delivered to,
// a loopback, private or otherwise internal one stays refused, never dialled.
func TestClientJudgesMappedAnswersAsTheirIPv4Address(t *testing.T) {
	t.Parallel()
	var got atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		got.Add(1)
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(srv.Close)
	_, port, err := net.SplitHostPort(srv.Listener.Addr().String())
	require.NoError(t, err)

	resolver := testResolver{
		"erp.test":        {netip.MustParseAddr("::ffff:93.184.216.34")},
		"loopback.test":   {netip.MustParseAddr("::ffff:127.0.0.1")},
		"private.test":    {netip.MustParseAddr("::ffff:10.1.2.3")},
		"private2.test":   {netip.MustParseAddr("::ffff:192.168.7.1")},
		"metadata.test":   {netip.MustParseAddr("::ffff:169.254.169.254")},
		"cgnat.test":      {netip.MustParseAddr("::ffff:100.64.0.1")},
		"zero.test":       {netip.MustParseAddr("::ffff:0.0.0.0")},
		"mixed.test":      {netip.MustParseAddr("::ffff:93.184.216.34"), netip.MustParseAddr("::ffff:127.0.0.1")},
		"scoped.test":     {netip.MustParseAddr("::ffff:93.184.216.34%eth0")},
		"compatible.test": {netip.MustParseAddr("::93.184.216.34")},
	}
	client, err := webhook.NewClient(webhook.ClientConfig{AllowHTTP: true, Resolver: resolver})
	require.NoError(t, err)
	// Every socket the client opens lands on srv, so a refused target would
	// show up as a request there.
	asked := webhook.RouteDials(client, srv.Listener.Addr().String())

	resp, err := client.Post(t.Context(), "http://erp.test:"+port+"/hook", nil, []byte(`{}`))
	require.NoError(t, err, "a public IPv4 address in mapped form is delivered to")
	require.Equal(t, http.StatusNoContent, resp.Status)
	require.Equal(t, []string{"93.184.216.34:" + port}, asked(), "the socket is given the IPv4 address")
	require.Equal(t, int64(1), got.Load())

	for _, host := range []string{"loopback.test", "private.test", "private2.test", "metadata.test", "cgnat.test", "zero.test", "mixed.test", "scoped.test", "compatible.test",
		"[::ffff:127.0.0.1]", "[::ffff:10.0.0.1]", "[::ffff:a9fe:a9fe]"} {
		_, err := client.Post(t.Context(), "http://"+host+":"+port+"/hook", nil, []byte(`{}`))
		require.ErrorIs(t, err, webhook.ErrForbiddenAddress, host)
	}
	require.Len(t, asked(), 1, "no refused target was dialled")
	require.Equal(t, int64(1), got.Load())

	// The dial-time check agrees, in either form.
	require.NoError(t, webhook.Control(client, "[::ffff:93.184.216.34]:443"))
	for _, addr := range []string{"[::ffff:127.0.0.1]:443", "[::ffff:10.1.2.3]:443", "[::ffff:169.254.169.254]:80"} {
		require.ErrorIs(t, webhook.Control(client, addr), webhook.ErrForbiddenAddress, addr)
	}
	// And so does the check of a URL's literal host.
	_, err = client.CheckURL("https://[::ffff:93.184.216.34]/hook")
	require.NoError(t, err)
}
