package dberr

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// Connection reports whether err is the connection's or the server's
// trouble rather than the statement's (see the package documentation).
func Connection(err error) bool {
	if err == nil {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return connectionCode(pgErr)
	}
	if errors.Is(err, context.Canceled) {
		return false // the caller gave up: nothing about the database
	}
	var (
		connectErr *pgconn.ConnectError
		netErr     net.Error
	)
	return errors.As(err, &connectErr) || errors.As(err, &netErr) ||
		pgconn.SafeToRetry(err) || pgconn.Timeout(err) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, pgconn.ErrConnClosed)
}

// connectionCode reports whether the server's answer is about the
// connection or the session rather than the statement.
func connectionCode(pgErr *pgconn.PgError) bool {
	switch pgErr.Code {
	case "57P01", // admin_shutdown: the server is stopping
		"57P02", // crash_shutdown: another backend crashed
		"57P03", // cannot_connect_now: starting up, shutting down, in recovery
		"26000", // invalid_sql_statement_name: a cached statement the session lost
		"42P05": // duplicate_prepared_statement: a name the session holds already
		return true
	case "0A000": // feature_not_supported: only this message is about the session
		return strings.Contains(pgErr.Message, "cached plan must not change result type")
	}
	return strings.HasPrefix(pgErr.Code, "08")
}
