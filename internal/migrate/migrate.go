package migrate

import (
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/llmq/llmq/internal/dbsql"
)

//go:embed sql/*.sql
var files embed.FS

// ErrUnknownVersion is returned when a target version, or a version to
// revert, is not one this build knows.
var ErrUnknownVersion = errors.New("unknown migration version")

// ErrMigrationChanged is returned when an applied migration's recorded
// checksum differs from this build's SQL for it: the schema was built by
// other SQL than this build expects, and migrating further could go wrong.
var ErrMigrationChanged = errors.New("applied migration differs from this build's")

// Migration is one versioned step, its SQL rendered for a schema.
type Migration struct {
	Version int
	Name    string
	Up      string
	Down    string
	// Checksum identifies the up SQL as written (before the schema is
	// rendered into it), so every schema records the same value.
	Checksum string
}

// Status is a migration and, when applied, when that happened.
type Status struct {
	Version   int
	Name      string
	AppliedAt time.Time // zero while pending
	Known     bool      // false for a version applied by a newer build
	Changed   bool      // applied with SQL other than this build's
}

// Applied reports whether the migration has been applied.
func (s Status) Applied() bool { return !s.AppliedAt.IsZero() }

// Migrator applies the embedded migrations to one schema.
type Migrator struct {
	schema     dbsql.Schema
	migrations []Migration
}

// New loads the embedded migrations rendered for schema.
func New(schema dbsql.Schema) (*Migrator, error) {
	migrations, err := load(files, schema)
	if err != nil {
		return nil, err
	}
	return &Migrator{schema: schema, migrations: migrations}, nil
}

// Migrations lists every migration this build knows, oldest first.
func (m *Migrator) Migrations() []Migration { return slices.Clone(m.migrations) }

// Latest is the highest version this build knows.
func (m *Migrator) Latest() int { return m.migrations[len(m.migrations)-1].Version }

// Bootstrap is the SQL that creates the schema and the table recording
// applied migrations. Up runs it under the lock before its first step; it is
// exported for printing to teams that run their own migration tool.
func (m *Migrator) Bootstrap() string {
	return m.schema.Render(`CREATE SCHEMA IF NOT EXISTS ` + m.schema.Name() + `;
CREATE TABLE IF NOT EXISTS /*schema*/migrations (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    checksum   text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);`)
}

// Schema is the schema this migrator manages.
func (m *Migrator) Schema() string { return m.schema.Name() }

// Record is the SQL that records mig as applied, for the same teams. Names
// come from embedded file names matching [a-z0-9_]+, so they need no quoting.
func (m *Migrator) Record(mig Migration) string {
	return m.schema.Render(fmt.Sprintf(
		"INSERT INTO /*schema*/migrations (version, name, checksum) VALUES (%d, '%s', '%s');", mig.Version, mig.Name, mig.Checksum))
}

// Unrecord is the SQL that forgets mig, the counterpart of Record.
func (m *Migrator) Unrecord(mig Migration) string {
	return m.schema.Render(fmt.Sprintf("DELETE FROM /*schema*/migrations WHERE version = %d;", mig.Version))
}

// Up applies every pending migration up to target (0 means the latest), one
// transaction each, and returns the ones it applied.
func (m *Migrator) Up(ctx context.Context, db dbsql.Beginner, target int) ([]Migration, error) {
	if target == 0 {
		target = m.Latest()
	}
	if _, ok := m.find(target); !ok {
		return nil, fmt.Errorf("migrate up to %d: %w (known: 1..%d)", target, ErrUnknownVersion, m.Latest())
	}
	var applied []Migration
	for {
		var step *Migration
		err := m.locked(ctx, db, func(tx pgx.Tx, done map[int]bool) error {
			step = nil
			for i := range m.migrations {
				mig := &m.migrations[i]
				if mig.Version <= target && !done[mig.Version] {
					step = mig
					break
				}
			}
			if step == nil {
				return nil
			}
			if _, err := tx.Exec(ctx, step.Up); err != nil {
				return fmt.Errorf("migration %d_%s up: %w", step.Version, step.Name, err)
			}
			_, err := tx.Exec(ctx, m.schema.Render(`INSERT INTO /*schema*/migrations (version, name, checksum) VALUES ($1, $2, $3)`), step.Version, step.Name, step.Checksum)
			return err
		})
		if err != nil {
			return applied, err
		}
		if step == nil {
			return applied, nil
		}
		applied = append(applied, *step)
	}
}

// Down reverts applied migrations above target, newest first, one
// transaction each, and returns the ones it reverted. Down to 0 drops every
// llmq table; the schema and its migrations table remain.
func (m *Migrator) Down(ctx context.Context, db dbsql.Beginner, target int) ([]Migration, error) {
	if target < 0 {
		return nil, fmt.Errorf("migrate down to %d: %w", target, ErrUnknownVersion)
	}
	if _, ok := m.find(target); !ok && target != 0 {
		return nil, fmt.Errorf("migrate down to %d: %w (known: 1..%d)", target, ErrUnknownVersion, m.Latest())
	}
	var reverted []Migration
	for {
		var step *Migration
		err := m.locked(ctx, db, func(tx pgx.Tx, done map[int]bool) error {
			step = nil
			newest := 0
			for v := range done {
				newest = max(newest, v)
			}
			if newest <= target {
				return nil
			}
			mig, ok := m.find(newest)
			if !ok {
				return fmt.Errorf("migrate down: version %d was applied by a newer build: %w", newest, ErrUnknownVersion)
			}
			step = &mig
			if _, err := tx.Exec(ctx, step.Down); err != nil {
				return fmt.Errorf("migration %d_%s down: %w", step.Version, step.Name, err)
			}
			_, err := tx.Exec(ctx, m.schema.Render(`DELETE FROM /*schema*/migrations WHERE version = $1`), step.Version)
			return err
		})
		if err != nil {
			return reverted, err
		}
		if step == nil {
			return reverted, nil
		}
		reverted = append(reverted, *step)
	}
}

// Status reports every known migration and any applied version this build
// does not know, ordered by version. It takes no lock and creates nothing.
func (m *Migrator) Status(ctx context.Context, db dbsql.Beginner) ([]Status, error) {
	var statuses []Status
	err := dbsql.WithTx(ctx, db, func(tx pgx.Tx) error {
		applied, err := m.applied(ctx, tx)
		if err != nil {
			return err
		}
		for _, mig := range m.migrations {
			st := Status{Version: mig.Version, Name: mig.Name, Known: true}
			if a, ok := applied[mig.Version]; ok {
				st.AppliedAt = a.at
				st.Changed = a.checksum != mig.Checksum
				delete(applied, mig.Version)
			}
			statuses = append(statuses, st)
		}
		for v, a := range applied {
			statuses = append(statuses, Status{Version: v, Name: a.name, AppliedAt: a.at})
		}
		return nil
	})
	slices.SortFunc(statuses, func(a, b Status) int { return a.Version - b.Version })
	return statuses, err
}

type appliedRow struct {
	name     string
	checksum string
	at       time.Time
}

// applied reads the migrations table, treating a missing table as nothing
// applied.
func (m *Migrator) applied(ctx context.Context, tx pgx.Tx) (map[int]appliedRow, error) {
	var exists bool
	if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, m.schema.Name()+".migrations").Scan(&exists); err != nil {
		return nil, fmt.Errorf("migrate: looking for the migrations table: %w", err)
	}
	out := map[int]appliedRow{}
	if !exists {
		return out, nil
	}
	rows, err := tx.Query(ctx, m.schema.Render(`SELECT version, name, checksum, applied_at FROM /*schema*/migrations`))
	if err != nil {
		return nil, fmt.Errorf("migrate: reading applied versions: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var v int
		var r appliedRow
		if err := rows.Scan(&v, &r.name, &r.checksum, &r.at); err != nil {
			return nil, fmt.Errorf("migrate: reading applied versions: %w", err)
		}
		out[v] = r
	}
	return out, rows.Err()
}

// locked runs step in a transaction that holds the schema's migration lock
// and sees the applied versions as of after the lock was granted.
func (m *Migrator) locked(ctx context.Context, db dbsql.Beginner, step func(tx pgx.Tx, done map[int]bool) error) error {
	return dbsql.WithTx(ctx, db, func(tx pgx.Tx) error {
		// hashtextextended gives a stable 64-bit key per schema, so installs in
		// different schemas of one database migrate independently.
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, "llmq.migrate:"+m.schema.Name()); err != nil {
			return fmt.Errorf("migrate: taking the migration lock: %w", err)
		}
		if _, err := tx.Exec(ctx, m.Bootstrap()); err != nil {
			return fmt.Errorf("migrate: creating schema %s: %w", m.schema.Name(), err)
		}
		applied, err := m.applied(ctx, tx)
		if err != nil {
			return err
		}
		done := make(map[int]bool, len(applied))
		for v, a := range applied {
			done[v] = true
			if mig, ok := m.find(v); ok && a.checksum != mig.Checksum {
				return fmt.Errorf("migrate: version %d (%s) in schema %s was applied from other SQL than this build's: %w",
					v, mig.Name, m.schema.Name(), ErrMigrationChanged)
			}
		}
		return step(tx, done)
	})
}

func (m *Migrator) find(version int) (Migration, bool) {
	i := slices.IndexFunc(m.migrations, func(mig Migration) bool { return mig.Version == version })
	if i < 0 {
		return Migration{}, false
	}
	return m.migrations[i], true
}

var fileName = regexp.MustCompile(`^(\d{4})_([a-z0-9_]+)\.(up|down)\.sql$`)

// load reads NNNN_name.up.sql / NNNN_name.down.sql pairs from fsys. Versions
// must start at 1, have no gaps, and come in complete pairs.
func load(fsys fs.FS, schema dbsql.Schema) ([]Migration, error) {
	entries, err := fs.ReadDir(fsys, "sql")
	if err != nil {
		return nil, fmt.Errorf("migrate: reading embedded migrations: %w", err)
	}
	byVersion := map[int]*Migration{}
	for _, e := range entries {
		match := fileName.FindStringSubmatch(e.Name())
		if match == nil {
			return nil, fmt.Errorf("migrate: embedded file %q is not NNNN_name.(up|down).sql", e.Name())
		}
		version, _ := strconv.Atoi(match[1])
		body, err := fs.ReadFile(fsys, path.Join("sql", e.Name()))
		if err != nil {
			return nil, fmt.Errorf("migrate: reading %s: %w", e.Name(), err)
		}
		mig := byVersion[version]
		if mig == nil {
			mig = &Migration{Version: version, Name: match[2]}
			byVersion[version] = mig
		}
		if mig.Name != match[2] {
			return nil, fmt.Errorf("migrate: version %d has two names, %q and %q", version, mig.Name, match[2])
		}
		if match[3] == "up" {
			mig.Up = schema.Render(string(body))
			sum := sha256.Sum256(body)
			mig.Checksum = hex.EncodeToString(sum[:])
		} else {
			mig.Down = schema.Render(string(body))
		}
	}
	migrations := make([]Migration, 0, len(byVersion))
	for v := 1; v <= len(byVersion); v++ {
		mig, ok := byVersion[v]
		if !ok {
			return nil, fmt.Errorf("migrate: versions must run 1..%d without gaps; %d is missing", len(byVersion), v)
		}
		if mig.Up == "" || mig.Down == "" {
			return nil, fmt.Errorf("migrate: version %d needs both an up and a down file", v)
		}
		migrations = append(migrations, *mig)
	}
	if len(migrations) == 0 {
		return nil, errors.New("migrate: no embedded migrations")
	}
	return migrations, nil
}
