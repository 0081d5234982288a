package console

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"net/http"
)

// CSRF: a signed double-submit token. A browser gets a random cookie the
// first time it loads a page; the token in every action form is the HMAC
// of that cookie under Config.CSRFKey. An action must carry both, and the
// token must match the cookie: another site can make the browser send the
// cookie, but cannot read a page to learn the token. Before that,
// net/http's CrossOriginProtection refuses what the browser labels as not
// same-origin (Sec-Fetch-Site), or, from browsers that do not send that
// header, an Origin whose host is not the request's Host, unless the
// origin is one of Config.TrustedOrigins. Sec-Fetch-Site comes first
// because a reverse proxy may rewrite Host: the browser's own label does
// not depend on it.

const csrfCookie = "llmq_console_csrf"

// csrfField is the form field holding the token.
const csrfField = "csrf_token"

// csrfToken returns the token for r's cookie, setting a new cookie first
// when r has none.
func (h *Handler) csrfToken(w http.ResponseWriter, r *http.Request) string {
	if c, err := r.Cookie(csrfCookie); err == nil && len(c.Value) >= 32 {
		return h.sign(c.Value)
	}
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return ""
	}
	value := base64.RawURLEncoding.EncodeToString(b[:])
	path := h.cfg.BasePath + "/"
	http.SetCookie(w, &http.Cookie{Name: csrfCookie, Value: value, Path: path, HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil || h.cfg.SecureCookie})
	return h.sign(value)
}

func (h *Handler) sign(cookie string) string {
	m := hmac.New(sha256.New, h.cfg.CSRFKey)
	m.Write([]byte("llmq console csrf\x00"))
	m.Write([]byte(cookie))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// checkCSRF returns why r may not act, or "" when it may.
func (h *Handler) checkCSRF(r *http.Request) string {
	if err := h.origins.Check(r); err != nil {
		return "the request came from another site or origin (" + err.Error() + "); a console behind a proxy that rewrites Host lists its public origin in TrustedOrigins"
	}
	c, err := r.Cookie(csrfCookie)
	if err != nil || c.Value == "" {
		return "the form carries no CSRF cookie: reload the page and try again"
	}
	token := r.PostFormValue(csrfField)
	if token == "" {
		return "the form carries no CSRF token"
	}
	if !hmac.Equal([]byte(token), []byte(h.sign(c.Value))) {
		return "the CSRF token does not match: reload the page and try again"
	}
	return ""
}

// action serves a POST that changes something: refused when actions are
// off (403), on a CSRF failure (403) or without an actor (403); the form
// is bounded to 64 KiB.
func (h *Handler) action(fn func(w http.ResponseWriter, r *http.Request, actor string) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !h.cfg.EnableActions {
			h.fail(w, r, &httpError{status: http.StatusForbidden, msg: "actions are off: this console is read-only"})
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
		if err := r.ParseForm(); err != nil {
			h.fail(w, r, badInput("form", "could not be read: "+err.Error()))
			return
		}
		if err := checkParams(r.Form); err != nil {
			h.fail(w, r, err)
			return
		}
		if why := h.checkCSRF(r); why != "" {
			h.fail(w, r, &httpError{status: http.StatusForbidden, msg: "csrf: " + why})
			return
		}
		actor := h.cfg.Actor(r)
		if actor == "" {
			h.fail(w, r, &httpError{status: http.StatusForbidden, msg: "actor: the host did not say who is acting; actions need a name to record"})
			return
		}
		if err := fn(w, r, actor); err != nil {
			h.fail(w, r, err)
		}
	}
}
