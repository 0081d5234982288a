package invoice

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/examples/internal/serve"
	"github.com/llmq/llmq/llmqtest"
)

const apiToken = "tok-acme"

// apiFixture is the API on a real server over a schema of the test's own,
// with its log captured.
type apiFixture struct {
	t   *testing.T
	svc *Service
	srv *httptest.Server
	log *syncBuffer
	db  *llmqtest.DB
}

// syncBuffer is a log sink that handlers write from their own goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func setupAPI(t *testing.T) *apiFixture {
	t.Helper()
	db := llmqtest.NewDB(t)
	log := &syncBuffer{}
	svc, err := New(db.Pool, Config{
		Schema: db.Schema, Auth: NewAuth(map[string]Credential{apiToken: {Tenant: "acme"}}),
		Logger: slog.New(slog.NewTextHandler(log, nil)),
	})
	require.NoError(t, err)
	require.NoError(t, svc.Migrate(t.Context()))
	srv := httptest.NewServer(svc.Handler())
	t.Cleanup(srv.Close)
	return &apiFixture{t: t, svc: svc, srv: srv, log: log, db: db}
}

type apiAnswer struct {
	status int
	header http.Header
	err    apiError
	body   []byte
}

func (f *apiFixture) call(method, path string, header http.Header, body []byte) apiAnswer {
	f.t.Helper()
	req, err := http.NewRequestWithContext(f.t.Context(), method, f.srv.URL+path, bytes.NewReader(body))
	require.NoError(f.t, err)
	req.Header.Set("Authorization", "Bearer "+apiToken)
	for k, vs := range header {
		req.Header[k] = vs
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(f.t, err)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(f.t, err)
	a := apiAnswer{status: resp.StatusCode, header: resp.Header, body: data}
	var out struct {
		Error apiError `json:"error"`
	}
	if json.Unmarshal(data, &out) == nil {
		a.err = out.Error
	}
	return a
}

// rows counts the documents and jobs in the test's schema.
func (f *apiFixture) rows() (documents, jobs int) {
	f.t.Helper()
	ctx := f.t.Context()
	require.NoError(f.t, f.db.Pool.QueryRow(ctx, "SELECT count(*) FROM "+f.db.Schema+".invoice_documents").Scan(&documents))
	require.NoError(f.t, f.db.Pool.QueryRow(ctx, "SELECT count(*) FROM "+f.db.Schema+".jobs").Scan(&jobs))
	return documents, jobs
}

func createBody(name string, version any, sha string) []byte {
	return fmt.Appendf(nil, `{"document":{"name":%q,"version":%v,"sha256":%q},"schema":"invoice-v1"}`, name, version, sha)
}

// Every refused input is a 4xx naming the field at fault, answered before
// any query: nothing is written, nothing is logged as a failure of the
// service.
func TestAPIRefusesBadInputNamingTheField(t *testing.T) {
	t.Parallel()
	f := setupAPI(t)
	doc, err := f.svc.PutDocument(t.Context(), "acme", "inv-1.txt", "Supplier: Nordwind\nTotal: 10.71\n")
	require.NoError(t, err)
	good := createBody(doc.Name, doc.Version, doc.SHA256)
	key := func(k string) http.Header { return http.Header{"Idempotency-Key": {k}} }
	longKey := strings.Repeat("k", 300)

	cases := []struct {
		name   string
		method string
		path   string
		header http.Header
		body   []byte
		status int
		field  string
	}{
		{"version above 2^31-1", http.MethodPost, "/extraction-jobs", key("k1"), createBody(doc.Name, int64(math.MaxInt32)+1, doc.SHA256), 422, "document.version"},
		{"version beyond int64", http.MethodPost, "/extraction-jobs", key("k1"), createBody(doc.Name, "99999999999999999999", doc.SHA256), 400, "document.version"},
		{"version zero", http.MethodPost, "/extraction-jobs", key("k1"), createBody(doc.Name, 0, doc.SHA256), 422, "document.version"},
		{"version not a number", http.MethodPost, "/extraction-jobs", key("k1"), createBody(doc.Name, `"1"`, doc.SHA256), 400, "document.version"},
		{"NUL in the document name", http.MethodPost, "/extraction-jobs", key("k1"), []byte(`{"document":{"name":"inv\u0000.txt","version":1,"sha256":"` + doc.SHA256 + `"},"schema":"invoice-v1"}`), 422, "document.name"},
		{"invalid UTF-8 in the document name", http.MethodPost, "/extraction-jobs", key("k1"), []byte("{\"document\":{\"name\":\"inv\xff.txt\",\"version\":1,\"sha256\":\"" + doc.SHA256 + "\"},\"schema\":\"invoice-v1\"}"), 422, "document.name"},
		{"no document name", http.MethodPost, "/extraction-jobs", key("k1"), createBody("", 1, doc.SHA256), 422, "document.name"},
		{"bad digest", http.MethodPost, "/extraction-jobs", key("k1"), createBody(doc.Name, 1, "abc"), 422, "document.sha256"},
		{"other schema", http.MethodPost, "/extraction-jobs", key("k1"), []byte(`{"document":{"name":"inv-1.txt","version":1,"sha256":"` + doc.SHA256 + `"},"schema":"v9"}`), 422, "schema"},
		{"trailing garbage", http.MethodPost, "/extraction-jobs", key("k1"), append(bytes.Clone(good), '}'), 400, "body"},
		{"two objects", http.MethodPost, "/extraction-jobs", key("k1"), append(bytes.Clone(good), good...), 400, "body"},
		{"an object and a word", http.MethodPost, "/extraction-jobs", key("k1"), append(bytes.Clone(good), " true"...), 400, "body"},
		{"not JSON", http.MethodPost, "/extraction-jobs", key("k1"), []byte("document=inv-1.txt"), 400, "body"},
		{"unknown field", http.MethodPost, "/extraction-jobs", key("k1"), []byte(`{"document":{"name":"inv-1.txt","version":1,"sha256":"` + doc.SHA256 + `"},"schema":"invoice-v1","callback_url":"http://x"}`), 400, "callback_url"},
		{"body over the limit", http.MethodPost, "/extraction-jobs", key("k1"), append(append([]byte(`{"document":{"name":"`), bytes.Repeat([]byte("a"), maxCreateBody)...), `"}}`...), 413, "body"},
		{"no key", http.MethodPost, "/extraction-jobs", nil, good, 400, "Idempotency-Key"},
		{"key too long", http.MethodPost, "/extraction-jobs", key(longKey), good, 422, "Idempotency-Key"},
		{"key with a control character", http.MethodPost, "/extraction-jobs", key("k\t1"), good, 422, "Idempotency-Key"},
		{"key not UTF-8", http.MethodPost, "/extraction-jobs", key("k\xff1"), good, 422, "Idempotency-Key"},
		{"document not UTF-8", http.MethodPut, "/documents/inv-2.txt", nil, []byte("Total: 10\xff\xfe"), 422, "body"},
		{"NUL in a document", http.MethodPut, "/documents/inv-2.txt", nil, []byte("Total: 10\x00.71"), 422, "body"},
		{"document name with a space", http.MethodPut, "/documents/inv%202.txt", nil, []byte("Total: 10.71"), 422, "name"},
		{"document over the limit", http.MethodPut, "/documents/inv-2.txt", nil, bytes.Repeat([]byte("a"), maxDocumentText+1), 413, "body"},
		{"needed_by in the past", http.MethodPost, "/extraction-jobs", key("k1"), []byte(`{"document":{"name":"inv-1.txt","version":1,"sha256":"` + doc.SHA256 + `"},"schema":"invoice-v1","needed_by":"2020-01-01T00:00:00Z"}`), 422, "needed_by"},
		{"needed_by not a time", http.MethodPost, "/extraction-jobs", key("k1"), []byte(`{"document":{"name":"inv-1.txt","version":1,"sha256":"` + doc.SHA256 + `"},"schema":"invoice-v1","needed_by":"tomorrow"}`), 400, "needed_by"},
		{"bad cursor", http.MethodGet, "/extraction-jobs?cursor=%00%ff", nil, nil, 422, "cursor"},
	}
	for _, tc := range cases {
		a := f.call(tc.method, tc.path, tc.header, tc.body)
		require.Equal(t, tc.status, a.status, "%s: %s", tc.name, a.body)
		require.Equal(t, tc.field, a.err.Field, "%s: %s", tc.name, a.body)
		require.NotEmpty(t, a.err.Message, tc.name)
	}
	documents, jobs := f.rows()
	require.Equal(t, 1, documents, "no document was stored")
	require.Zero(t, jobs, "no job was accepted")
	require.NotContains(t, f.log.String(), "answering 5", "no refusal is a failure of the service")

	// The good request, for contrast, is accepted.
	a := f.call(http.MethodPost, "/extraction-jobs", key("k1"), good)
	require.Equal(t, http.StatusAccepted, a.status, "%s", a.body)
}

// A failure of the service's own is a 503 with Retry-After on every route,
// and its cause is logged.
func TestAPIUnavailableIsLoggedWithRetryAfter(t *testing.T) {
	t.Parallel()
	f := setupAPI(t)
	doc, err := f.svc.PutDocument(t.Context(), "acme", "inv-1.txt", "Total: 10.71\n")
	require.NoError(t, err)
	// The service's own pool, closed: every query fails, as when the
	// database is unreachable.
	pool := closablePool(t)
	svc, err := New(pool, Config{Schema: f.db.Schema, Auth: f.svc.cfg.Auth, Logger: f.svc.cfg.Logger})
	require.NoError(t, err)
	pool.Close()
	f.srv.Config.Handler = svc.Handler()

	for _, tc := range []struct {
		method, path string
		header       http.Header
		body         []byte
	}{
		{http.MethodPut, "/documents/inv-2.txt", nil, []byte("Total: 1.00")},
		{http.MethodPost, "/extraction-jobs", http.Header{"Idempotency-Key": {"k1"}}, createBody(doc.Name, doc.Version, doc.SHA256)},
		{http.MethodGet, "/extraction-jobs", nil, nil},
		{http.MethodGet, "/extraction-jobs/0193a1c4-6e2f-7c4e-9b1a-2d3e4f5a6b7c", nil, nil},
		{http.MethodGet, "/extraction-jobs/events", nil, nil},
	} {
		a := f.call(tc.method, tc.path, tc.header, tc.body)
		require.Equal(t, http.StatusServiceUnavailable, a.status, "%s %s: %s", tc.method, tc.path, a.body)
		require.Equal(t, "1", a.header.Get("Retry-After"), "%s %s", tc.method, tc.path)
		require.Contains(t, f.log.String(), "path="+tc.path, "%s %s is logged", tc.method, tc.path)
	}
	require.Equal(t, 5, strings.Count(f.log.String(), "answering 503"))
	require.Contains(t, f.log.String(), "closed pool", "with its cause")
}

// System capacity is a 503 too: with Retry-After, and logged.
func TestAPICapacityIsLoggedWithRetryAfter(t *testing.T) {
	t.Parallel()
	db := llmqtest.NewDB(t)
	log := &syncBuffer{}
	svc, err := New(db.Pool, Config{
		Schema: db.Schema, Auth: NewAuth(map[string]Credential{apiToken: {Tenant: "acme"}}),
		SystemMaxPendingJobs: 1, QuotaRetry: 100 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(log, nil)),
	})
	require.NoError(t, err)
	require.NoError(t, svc.Migrate(t.Context()))
	srv := httptest.NewServer(svc.Handler())
	t.Cleanup(srv.Close)
	f := &apiFixture{t: t, svc: svc, srv: srv, log: log, db: db}
	doc, err := svc.PutDocument(t.Context(), "acme", "inv-1.txt", "Total: 10.71\n")
	require.NoError(t, err)
	body := createBody(doc.Name, doc.Version, doc.SHA256)

	a := f.call(http.MethodPost, "/extraction-jobs", http.Header{"Idempotency-Key": {"k1"}}, body)
	require.Equal(t, http.StatusAccepted, a.status, "%s", a.body)
	a = f.call(http.MethodPost, "/extraction-jobs", http.Header{"Idempotency-Key": {"k2"}}, body)
	require.Equal(t, http.StatusServiceUnavailable, a.status, "%s", a.body)
	require.Equal(t, "capacity", a.err.Code)
	require.Equal(t, "1", a.header.Get("Retry-After"), "every 503 says when to retry")
	require.Contains(t, log.String(), "system at capacity")
	_, jobs := f.rows()
	require.Equal(t, 1, jobs)
}

// FuzzDecodeCreateRequest feeds arbitrary bodies to the decoding of POST
// /extraction-jobs: it never panics; what it refuses is a 4xx naming a
// field; what it accepts is exactly one JSON value whose values the
// database can hold.
func FuzzDecodeCreateRequest(f *testing.F) {
	sha := strings.Repeat("ab", 32)
	for _, seed := range [][]byte{
		createBody("inv-1.txt", 1, sha), createBody("inv-1.txt", int64(math.MaxInt32)+1, sha), createBody("inv-1.txt", "1e3", sha),
		[]byte(`{"document":{"name":"a\u0000b","version":1,"sha256":"` + sha + `"},"schema":"invoice-v1"}`),
		append(createBody("a", 1, sha), '}'), append(createBody("a", 1, sha), createBody("a", 1, sha)...),
		[]byte(`{"document":null,"schema":"invoice-v1"}`), []byte(`[]`), []byte(`null`), []byte("{\"document\":{\"name\":\"\xff\"}}"), {},
		[]byte(`{"document":{"name":"a","version":1,"sha256":"` + sha + `"},"schema":"invoice-v1","needed_by":"2030-01-01T00:00:00Z"}`),
		[]byte(`{"document":{"name":"a","version":1,"sha256":"` + sha + `"},"schema":"invoice-v1","needed_by":"x"}`),
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, cerr := decodeCreateRequest(http.MaxBytesReader(nil, io.NopCloser(bytes.NewReader(body)), maxCreateBody))
		if cerr != nil {
			if cerr.status < 400 || cerr.status > 499 || cerr.field == "" || cerr.message == "" {
				t.Fatalf("refused %q with %+v: want a 4xx naming the field", body, cerr)
			}
			return
		}
		if !json.Valid(body) {
			t.Fatalf("accepted %q, which is not exactly one JSON value", body)
		}
		if !nameRe.MatchString(req.Document.Name) || req.Document.Version < 1 || req.Document.Version > math.MaxInt32 ||
			!hexRe.MatchString(req.Document.SHA256) || req.Schema != SchemaV1 {
			t.Fatalf("accepted %q as %+v", body, req)
		}
	})
}

// uploadBody is a POST /extraction-batches body naming version 1 of each
// document, all with digest sha.
func uploadBody(sha string, names ...string) []byte {
	req := BatchRequest{Documents: []Document{}, Schema: SchemaV1}
	for _, n := range names {
		req.Documents = append(req.Documents, Document{Name: n, Version: 1, SHA256: sha})
	}
	b, err := json.Marshal(req)
	if err != nil {
		panic(err)
	}
	return b
}

// FuzzDecodeBatchRequest feeds arbitrary bodies to the decoding of POST
// /extraction-batches: it never panics; what it refuses is a 4xx naming a
// field; what it accepts is exactly one JSON value holding 1 to
// MaxUploadDocuments distinct documents the database can hold.
func FuzzDecodeBatchRequest(f *testing.F) {
	sha := strings.Repeat("ab", 32)
	for _, seed := range [][]byte{
		uploadBody(sha, "a"), uploadBody(sha, "a", "b"), uploadBody(sha, "a", "a"), uploadBody(sha),
		[]byte(`{"documents":[{"name":"a","version":0,"sha256":"` + sha + `"}],"schema":"invoice-v1"}`),
		[]byte(`{"documents":[null],"schema":"invoice-v1"}`), []byte(`{"documents":null}`), []byte(`{"documents":{}}`),
		append(uploadBody(sha, "a"), uploadBody(sha, "a")...), []byte(`[]`), {},
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, cerr := decodeBatchRequest(http.MaxBytesReader(nil, io.NopCloser(bytes.NewReader(body)), maxUploadBody))
		if cerr != nil {
			if cerr.status < 400 || cerr.status > 499 || cerr.field == "" || cerr.message == "" {
				t.Fatalf("refused %q with %+v: want a 4xx naming the field", body, cerr)
			}
			return
		}
		if !json.Valid(body) {
			t.Fatalf("accepted %q, which is not exactly one JSON value", body)
		}
		if len(req.Documents) == 0 || len(req.Documents) > MaxUploadDocuments || req.Schema != SchemaV1 {
			t.Fatalf("accepted %q as %+v", body, req)
		}
		seen := map[Document]bool{}
		for _, d := range req.Documents {
			if !nameRe.MatchString(d.Name) || d.Version < 1 || d.Version > math.MaxInt32 || !hexRe.MatchString(d.SHA256) {
				t.Fatalf("accepted %q with document %+v", body, d)
			}
			d.SHA256 = ""
			if seen[d] {
				t.Fatalf("accepted %q naming %+v twice", body, d)
			}
			seen[d] = true
		}
	})
}

// The handler refuses before it reads anything: a refused request costs no
// query (checked with a service whose pool is closed, where any query would
// answer 503).
func TestAPIRefusesBeforeAnyQuery(t *testing.T) {
	t.Parallel()
	db := llmqtest.NewDB(t)
	pool := closablePool(t)
	svc, err := New(pool, Config{Schema: db.Schema, Auth: NewAuth(map[string]Credential{apiToken: {Tenant: "acme"}}), Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	pool.Close()
	srv := httptest.NewServer(svc.Handler())
	t.Cleanup(srv.Close)
	f := &apiFixture{t: t, svc: svc, srv: srv, log: &syncBuffer{}, db: db}
	sha := strings.Repeat("ab", 32)
	for _, tc := range []struct {
		method, path, key string
		body              []byte
		want              int
	}{
		{http.MethodPost, "/extraction-jobs", "k1", createBody("inv-1.txt", int64(math.MaxInt32)+1, sha), 422},
		{http.MethodPost, "/extraction-jobs", "k1", []byte(`{"document":{"name":"a\u0000b","version":1,"sha256":"` + sha + `"},"schema":"invoice-v1"}`), 422},
		{http.MethodPost, "/extraction-jobs", "k1", append(createBody("inv-1.txt", 1, sha), '}'), 400},
		{http.MethodPost, "/extraction-jobs", "k\t1", createBody("inv-1.txt", 1, sha), 422},
		{http.MethodPost, "/extraction-jobs", "k\xff1", createBody("inv-1.txt", 1, sha), 422},
		{http.MethodPost, "/extraction-batches", "k1", uploadBody(sha, "a", "b", "a"), 422},
		{http.MethodPost, "/extraction-batches", "k1", uploadBody(sha), 422},
		{http.MethodPost, "/extraction-batches", "k1", uploadBody(sha, make([]string, MaxUploadDocuments+1)...), 422},
		{http.MethodPost, "/extraction-batches", "k1", uploadBody(sha, strings.Repeat("a", maxUploadBody)), 413},
		{http.MethodPost, "/extraction-batches", "", uploadBody(sha, "a"), 400},
		{http.MethodPost, "/extraction-batches", "k1", append(uploadBody(sha, "a"), '}'), 400},
		{http.MethodPut, "/documents/inv-1.txt", "", []byte("bad \xff"), 422},
		{http.MethodPut, "/documents/inv-1.txt", "", []byte("nul \x00"), 422},
	} {
		a := f.call(tc.method, tc.path, http.Header{"Idempotency-Key": {tc.key}}, tc.body)
		require.Equal(t, tc.want, a.status, "%s %s %q: %s", tc.method, tc.path, tc.body, a.body)
	}
}

// The event stream outlives the server's read and write timeouts, which
// bound every other request: it sets a deadline per write in place of the
// server's, and events written after the timeouts expired still arrive.
func TestEventStreamOutlivesServerTimeouts(t *testing.T) {
	t.Parallel()
	f := setupAPI(t)
	const limit = 300 * time.Millisecond
	srv := httptest.NewUnstartedServer(f.svc.Handler())
	serve.Limits{Read: limit, Write: limit}.Apply(srv.Config)
	srv.Start()
	t.Cleanup(srv.Close)
	f.srv = srv

	ctx, cancel := context.WithCancel(t.Context())
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/extraction-jobs/events", http.NoBody)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+apiToken)
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	lines, readerDone := readLines(ctx, resp.Body)
	defer func() {
		cancel() // ends the request, so the reader's Scan returns
		<-readerDone
	}()
	require.Equal(t, ": stream open", <-lines)

	// Time passing is what is under test: both timeouts expire while the
	// stream waits.
	<-time.After(3 * limit)

	doc, err := f.svc.PutDocument(t.Context(), "acme", "inv-1.txt", "Total: 10.71\n")
	require.NoError(t, err)
	a := f.call(http.MethodPost, "/extraction-jobs", http.Header{"Idempotency-Key": {"k1"}}, createBody(doc.Name, doc.Version, doc.SHA256))
	require.Equal(t, http.StatusAccepted, a.status, "%s", a.body)
	var job JobView
	require.NoError(t, json.Unmarshal(a.body, &job))
	deadline := time.After(10 * time.Second)
	for {
		select {
		case line, ok := <-lines:
			require.True(t, ok, "the stream ended")
			if strings.HasPrefix(line, "data: ") && strings.Contains(line, job.JobID.String()) {
				return
			}
		case <-deadline:
			t.Fatal("no event for the job")
		}
	}
}

// readLines sends r's lines on lines until r ends or ctx does, then closes
// lines and done.
func readLines(ctx context.Context, r io.Reader) (lines <-chan string, done <-chan struct{}) {
	out, finished := make(chan string), make(chan struct{})
	go func() {
		defer close(finished)
		defer close(out)
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			select {
			case out <- sc.Text():
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, finished
}

// closablePool is a pool of the test's own on llmqtest's database, for a
// test that closes it to make every query fail.
func closablePool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(t.Context(), llmqtest.URL())
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}
