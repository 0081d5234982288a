package llmq

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/llmq/llmq/internal/dbsql"
	"github.com/llmq/llmq/internal/migrate"
)

// ErrInvalidSchema is returned for a schema name llmq refuses to use.
var ErrInvalidSchema = dbsql.ErrInvalidSchema

// ErrUnknownVersion is returned for a migration version this build does not
// know, as a target or as an applied version Down would have to revert.
var ErrUnknownVersion = migrate.ErrUnknownVersion

// ErrMigrationChanged is returned when a schema's applied migration was
// built from other SQL than this build's for the same version. Migrations
// are never edited once released; this refuses to build on a schema that
// does not match what the code expects.
var ErrMigrationChanged = migrate.ErrMigrationChanged

// DB starts transactions: *pgxpool.Pool and *pgx.Conn satisfy it. Migrate
// opens one short transaction per migration step.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Direction says which way Migrate moves.
type Direction int

const (
	// DirectionUp applies pending migrations; it is the zero value.
	DirectionUp Direction = iota
	// DirectionDown reverts applied migrations.
	DirectionDown
)

func (d Direction) String() string {
	if d == DirectionDown {
		return "down"
	}
	return "up"
}

// MigrateOptions configures Migrate. The zero value migrates the "llmq"
// schema up to the latest version.
type MigrateOptions struct {
	// Schema holds every llmq table. Default "llmq". Lower-case letters,
	// digits and underscores; "public" and pg_* are refused.
	Schema string
	// Direction is DirectionUp (default) or DirectionDown.
	Direction Direction
	// TargetVersion is where to stop. Up: 0 means the latest version.
	// Down: the version to keep; 0 reverts every migration and drops every
	// llmq table (the schema and its migrations table remain).
	TargetVersion int
}

// Migration is one versioned schema change.
type Migration struct {
	Version int
	Name    string
}

// MigrateResult says what a Migrate call did.
type MigrateResult struct {
	Direction Direction
	// Migrations are the steps applied (up) or reverted (down), in order.
	Migrations []Migration
}

// Migrate moves the schema to opts.TargetVersion, one transaction per
// migration. Every replica may call it at start-up at once: the calls
// serialise on an advisory lock and each step is applied exactly once. On
// error, the steps before the failing one stay applied and are listed in the
// result.
func Migrate(ctx context.Context, db DB, opts MigrateOptions) (*MigrateResult, error) {
	m, err := migrator(opts.Schema)
	if err != nil {
		return nil, err
	}
	var steps []migrate.Migration
	switch opts.Direction {
	case DirectionUp:
		steps, err = m.Up(ctx, db, opts.TargetVersion)
	case DirectionDown:
		steps, err = m.Down(ctx, db, opts.TargetVersion)
	default:
		return nil, fmt.Errorf("llmq: migrate: unknown direction %d", opts.Direction)
	}
	res := &MigrateResult{Direction: opts.Direction}
	for _, s := range steps {
		res.Migrations = append(res.Migrations, Migration{Version: s.Version, Name: s.Name})
	}
	if err != nil {
		return res, fmt.Errorf("llmq: migrate %s: %w", opts.Direction, err)
	}
	return res, nil
}

// MigrationState is one migration and whether it is applied.
type MigrationState struct {
	Migration
	// AppliedAt is zero while the migration is pending.
	AppliedAt time.Time
	// Known is false for a version applied by a newer build of llmq.
	Known bool
	// Changed is true for an applied version whose SQL differs from this
	// build's (see ErrMigrationChanged).
	Changed bool
}

// Applied reports whether the migration has been applied.
func (s MigrationState) Applied() bool { return !s.AppliedAt.IsZero() }

// MigrationStatus reports every migration this build knows, and any applied
// version it does not, for opts.Schema. It changes nothing.
func MigrationStatus(ctx context.Context, db DB, opts MigrateOptions) ([]MigrationState, error) {
	m, err := migrator(opts.Schema)
	if err != nil {
		return nil, err
	}
	statuses, err := m.Status(ctx, db)
	if err != nil {
		return nil, fmt.Errorf("llmq: migration status: %w", err)
	}
	out := make([]MigrationState, 0, len(statuses))
	for _, s := range statuses {
		out = append(out, MigrationState{
			Migration: Migration{Version: s.Version, Name: s.Name},
			AppliedAt: s.AppliedAt,
			Known:     s.Known,
			Changed:   s.Changed,
		})
	}
	return out, nil
}

// LatestVersion is the newest migration version this build knows.
func LatestVersion() int {
	m, err := migrator("")
	if err != nil {
		// The embedded migrations are part of the build; failing to load
		// them is a defect every test would catch.
		panic(err)
	}
	return m.Latest()
}

// MigrationSQL returns the SQL that Migrate would run to move a schema from
// version from to opts.TargetVersion, for teams that apply migrations with
// their own tool. Each step is wrapped in its own transaction and records
// itself in <schema>.migrations, so Migrate and MigrationStatus keep working
// on a schema migrated this way.
func MigrationSQL(opts MigrateOptions, from int) (string, error) {
	m, err := migrator(opts.Schema)
	if err != nil {
		return "", err
	}
	target := opts.TargetVersion
	if opts.Direction == DirectionUp && target == 0 {
		target = m.Latest()
	}
	if from < 0 || from > m.Latest() || target < 0 || target > m.Latest() {
		return "", fmt.Errorf("llmq: migration sql from %d to %d: %w (known: 1..%d)", from, target, ErrUnknownVersion, m.Latest())
	}
	var b strings.Builder
	switch opts.Direction {
	case DirectionUp:
		if from > target {
			return "", fmt.Errorf("llmq: migration sql: up from %d to %d goes backwards", from, target)
		}
		fmt.Fprintf(&b, "-- llmq schema %s: up from %d to %d\nBEGIN;\n%s\nCOMMIT;\n", m.Schema(), from, target, m.Bootstrap())
		for _, mig := range m.Migrations() {
			if mig.Version > from && mig.Version <= target {
				fmt.Fprintf(&b, "\n-- %04d_%s (up)\nBEGIN;\n%s\n%s\nCOMMIT;\n", mig.Version, mig.Name, strings.TrimSpace(mig.Up), m.Record(mig))
			}
		}
	case DirectionDown:
		if from < target {
			return "", fmt.Errorf("llmq: migration sql: down from %d to %d goes forwards", from, target)
		}
		fmt.Fprintf(&b, "-- llmq schema %s: down from %d to %d\n", m.Schema(), from, target)
		migs := m.Migrations()
		for i := len(migs) - 1; i >= 0; i-- {
			mig := migs[i]
			if mig.Version <= from && mig.Version > target {
				fmt.Fprintf(&b, "\n-- %04d_%s (down)\nBEGIN;\n%s\n%s\nCOMMIT;\n", mig.Version, mig.Name, strings.TrimSpace(mig.Down), m.Unrecord(mig))
			}
		}
	default:
		return "", errors.New("llmq: migration sql: unknown direction")
	}
	return b.String(), nil
}

func migrator(schemaName string) (*migrate.Migrator, error) {
	schema, err := dbsql.NewSchema(schemaName)
	if err != nil {
		return nil, fmt.Errorf("llmq: %w", err)
	}
	return migrate.New(schema)
}
