package webhook

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"syscall"
	"time"

	"code.dny.dev/ssrf"

	"github.com/llmq/llmq/llmqtype"
)

// Client defaults.
const (
	DefaultAttemptTimeout   = 15 * time.Second
	DefaultMaxResponseBytes = 8 << 10
	DefaultUserAgent        = "llmq-webhook/1"
	MaxURLLen               = 2048
)

var (
	// ErrForbiddenAddress means the target resolved to (or is) an address the
	// client never connects to: loopback, private, link-local, CGNAT,
	// benchmarking, multicast, unspecified, reserved, documentation, or an
	// IPv4-mapped, NAT64 or 6to4 form of one. (An IPv4-mapped address is
	// judged as the IPv4 address it maps: ::ffff:93.184.216.34 is public,
	// ::ffff:127.0.0.1 is loopback.) The error is an *AddressError.
	ErrForbiddenAddress = errors.New("webhook: forbidden address")
	// ErrInsecureURL is a plain-http URL while the client requires TLS.
	ErrInsecureURL = errors.New("webhook: URL is not https")
	// ErrInvalidURL is a URL the client refuses to send to (unparsable,
	// with credentials, without a host, or an ambiguous numeric host).
	ErrInvalidURL = errors.New("webhook: invalid URL")
)

// AddressError says which host and address were refused, and why.
type AddressError struct {
	Host   string
	Addr   netip.Addr // invalid when the host itself was refused
	Reason string
}

func (e *AddressError) Error() string {
	if e.Addr.IsValid() {
		return fmt.Sprintf("%v: %s resolves to %s (%s)", ErrForbiddenAddress, e.Host, e.Addr, e.Reason)
	}
	return fmt.Sprintf("%v: %s (%s)", ErrForbiddenAddress, e.Host, e.Reason)
}

// Unwrap makes errors.Is(err, ErrForbiddenAddress) true.
func (e *AddressError) Unwrap() error { return ErrForbiddenAddress }

// Resolver looks host names up; *net.Resolver satisfies it.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// ClientConfig configures a Client. The zero value is a TLS-only client that
// refuses every non-public address.
type ClientConfig struct {
	// AttemptTimeout bounds one request, from dialling to the last byte of
	// the response read. Default 15s.
	AttemptTimeout time.Duration
	// MaxResponseBytes is how much of a response body is read (and kept
	// for the attempt record); the rest is discarded unread. Default 8 KiB.
	MaxResponseBytes int64
	// AllowHTTP permits plain-http URLs. Off by default: deliveries carry
	// signed business data and must not travel in clear text.
	AllowHTTP bool
	// Allow exempts prefixes from the deny list, for tests on loopback or a
	// private network the operator vouches for. Empty by default.
	Allow []netip.Prefix
	// Resolver resolves host names. Default net.DefaultResolver.
	Resolver Resolver
	// UserAgent is sent with every request. Default "llmq-webhook/1".
	UserAgent string
}

// Client sends one HTTP POST per attempt and refuses any address that is not
// public, at dial time: it resolves names itself, checks every resolved
// address, dials only the addresses it checked, and checks again in the
// dialer's Control hook, which sees the exact address the socket connects
// to. It ignores proxy settings from the environment and never follows
// redirects.
type Client struct {
	http    *http.Client
	cfg     ClientConfig
	netDial func(ctx context.Context, network, addr string) (net.Conn, error)
}

// NewClient validates cfg once and builds the client.
func NewClient(cfg ClientConfig) (*Client, error) {
	if cfg.AttemptTimeout < 0 {
		return nil, &llmqtype.ValidationError{Kind: ErrInvalidConfig, Field: "AttemptTimeout", Problem: "must not be negative"}
	}
	if cfg.MaxResponseBytes < 0 {
		return nil, &llmqtype.ValidationError{Kind: ErrInvalidConfig, Field: "MaxResponseBytes", Problem: "must not be negative"}
	}
	for i, p := range cfg.Allow {
		if !p.IsValid() {
			return nil, &llmqtype.ValidationError{Kind: ErrInvalidConfig, Field: fmt.Sprintf("Allow[%d]", i), Problem: "is not a valid prefix"}
		}
	}
	cfg.AttemptTimeout = cmp.Or(cfg.AttemptTimeout, DefaultAttemptTimeout)
	cfg.MaxResponseBytes = cmp.Or(cfg.MaxResponseBytes, DefaultMaxResponseBytes)
	cfg.UserAgent = cmp.Or(cfg.UserAgent, DefaultUserAgent)
	if cfg.Resolver == nil {
		cfg.Resolver = net.DefaultResolver
	}
	c := &Client{cfg: cfg}
	dialer := &net.Dialer{Timeout: cfg.AttemptTimeout, Control: c.control}
	c.netDial = dialer.DialContext
	transport := &http.Transport{
		Proxy:                  nil, // never a proxy from the environment: it would dial for us, unchecked
		DialContext:            c.dialContext,
		ForceAttemptHTTP2:      true,
		TLSHandshakeTimeout:    cfg.AttemptTimeout,
		ResponseHeaderTimeout:  cfg.AttemptTimeout,
		MaxIdleConnsPerHost:    2,
		IdleConnTimeout:        90 * time.Second,
		MaxResponseHeaderBytes: 64 << 10,
	}
	c.http = &http.Client{
		Transport: transport,
		// A redirect is returned as the response (and counts as a failed
		// delivery): following it would send signed data to a place the
		// tenant never registered.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	return c, nil
}

// Response is what an attempt got back.
type Response struct {
	Status int
	Header http.Header
	// Body is at most MaxResponseBytes of the response body.
	Body    []byte
	Latency time.Duration
}

// CheckURL reports whether the client would send to raw at all: parsable,
// https (or http when allowed), with a host and no credentials, and not a
// literal address it refuses. Addresses behind names are checked at dial
// time.
func (c *Client) CheckURL(raw string) (*url.URL, error) {
	return checkURL(raw, c.cfg.AllowHTTP, c.allowed)
}

func checkURL(raw string, allowHTTP bool, allowed func(netip.Addr) bool) (*url.URL, error) {
	if len(raw) > MaxURLLen {
		return nil, fmt.Errorf("%w: longer than %d bytes", ErrInvalidURL, MaxURLLen)
	}
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidURL, err)
	}
	switch {
	case u.Scheme == "http" && !allowHTTP:
		return nil, fmt.Errorf("%w: %s", ErrInsecureURL, raw)
	case u.Scheme != "https" && u.Scheme != "http":
		return nil, fmt.Errorf("%w: scheme %q", ErrInvalidURL, u.Scheme)
	case u.User != nil:
		return nil, fmt.Errorf("%w: credentials in the URL", ErrInvalidURL)
	case u.Hostname() == "":
		return nil, fmt.Errorf("%w: no host", ErrInvalidURL)
	}
	if err := checkHostLiteral(u.Hostname(), allowed); err != nil {
		return nil, err
	}
	return u, nil
}

// checkHostLiteral refuses a host that is a forbidden address literal, or a
// numeric spelling only some resolvers read as an address (2130706433,
// 0177.0.0.1, 0x7f.1): what such a name means depends on the library that
// parses it, so none is sent to.
func checkHostLiteral(host string, allowed func(netip.Addr) bool) error {
	if a, err := netip.ParseAddr(host); err == nil {
		if reason := forbidden(a); reason != "" && !allowed(a) {
			return &AddressError{Host: host, Addr: a, Reason: reason}
		}
		return nil
	}
	if looksNumeric(host) {
		return &AddressError{Host: host, Reason: "numeric host that is not a dotted-quad address"}
	}
	return nil
}

// looksNumeric reports whether the last label is all hex digits after a 0x,
// or all digits: inet_aton forms such as "127.1" or "0x7f.0.0.1".
func looksNumeric(host string) bool {
	last := host[strings.LastIndexByte(host, '.')+1:]
	if last == "" {
		return false
	}
	if strings.HasPrefix(strings.ToLower(last), "0x") {
		return strings.Trim(strings.ToLower(last[2:]), "0123456789abcdef") == ""
	}
	return strings.Trim(last, "0123456789") == ""
}

// Post sends body to rawURL with header, and returns the response (its body
// truncated) or the error that kept it from arriving.
func (c *Client) Post(ctx context.Context, rawURL string, header http.Header, body []byte) (*Response, error) {
	u, err := c.CheckURL(rawURL)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.AttemptTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.String(), bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidURL, err)
	}
	for k, vs := range header {
		req.Header[k] = vs
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", c.cfg.UserAgent)
	start := time.Now()
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, c.cfg.MaxResponseBytes))
	out := &Response{Status: resp.StatusCode, Header: resp.Header, Body: data, Latency: time.Since(start)}
	if err != nil {
		return out, fmt.Errorf("webhook: reading the response: %w", err)
	}
	return out, nil
}

// dialContext resolves addr's host itself, refuses the dial if any address
// is forbidden (a name that resolves to an internal address among public
// ones is hostile), and dials the checked addresses in turn.
func (c *Client) dialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidURL, err)
	}
	if err := checkHostLiteral(host, c.allowed); err != nil {
		return nil, err
	}
	var addrs []netip.Addr
	if a, err := netip.ParseAddr(host); err == nil {
		addrs = []netip.Addr{a}
	} else {
		addrs, err = c.cfg.Resolver.LookupNetIP(ctx, "ip", host)
		if err != nil {
			return nil, fmt.Errorf("webhook: resolving %s: %w", host, err)
		}
		if len(addrs) == 0 {
			return nil, fmt.Errorf("webhook: resolving %s: no addresses", host)
		}
	}
	for _, a := range addrs {
		if reason := forbidden(a); reason != "" && !c.allowed(a) {
			return nil, &AddressError{Host: host, Addr: a, Reason: reason}
		}
	}
	var errs []error
	for _, a := range addrs {
		conn, err := c.netDial(ctx, network, net.JoinHostPort(a.Unmap().String(), port))
		if err == nil {
			return conn, nil
		}
		errs = append(errs, err)
	}
	return nil, errors.Join(errs...)
}

// control is the dialer's last word: it sees the address the socket is about
// to connect to, whatever path led there.
func (c *Client) control(network, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("%w: %s", ErrForbiddenAddress, address)
	}
	if reason := forbidden(ap.Addr()); reason != "" && !c.allowed(ap.Addr()) {
		return &AddressError{Host: address, Addr: ap.Addr(), Reason: reason}
	}
	return nil
}

func (c *Client) allowed(a netip.Addr) bool {
	for _, p := range c.cfg.Allow {
		if p.Contains(a.Unmap()) || p.Contains(a) {
			return true
		}
	}
	return false
}

// forbidden says why a is not a public unicast address, or "" when it is.
// The prefix lists are the IANA special-purpose registries as kept by
// code.dny.dev/ssrf. An IPv4-mapped address (::ffff:a.b.c.d) is judged as
// the IPv4 address it maps, which is where a socket given it connects (and
// how Go's resolver answers with the IPv4 entries of /etc/hosts). Other
// IPv6 is allowed only inside global unicast 2000::/3, which excludes
// IPv4-compatible, NAT64 (64:ff9b::/96), link-local, unique-local and
// multicast forms.
func forbidden(a netip.Addr) string {
	if !a.IsValid() {
		return "invalid address"
	}
	if a.Zone() != "" {
		return "scoped address"
	}
	a = a.Unmap()
	if a.Is4() {
		for _, p := range ssrf.IPv4DeniedPrefixes {
			if p.Contains(a) {
				return "special-purpose IPv4 range " + p.String()
			}
		}
		return ""
	}
	if !ssrf.IPv6GlobalUnicast.Contains(a) {
		return "IPv6 outside global unicast 2000::/3"
	}
	for _, p := range ssrf.IPv6DeniedPrefixes {
		if p.Contains(a) {
			return "special-purpose IPv6 range " + p.String()
		}
	}
	return ""
}
