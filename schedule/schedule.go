package schedule

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"strings"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/llmq/llmq/internal/validate"
	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/llmqtype"
)

// ErrInvalid is matched (errors.Is) by every *llmqtype.ValidationError
// this package returns for a bad Schedule or Config.
var ErrInvalid = errors.New("schedule: invalid schedule")

// ErrNotFound is returned for a schedule name no row has.
var ErrNotFound = errors.New("schedule: not found")

// ErrCodeOwned is returned by Store.Put for a name a schedule registered in
// code (Config.Schedules) already holds.
var ErrCodeOwned = errors.New("schedule: the name belongs to a schedule registered in code")

// Limits of a Schedule.
const (
	MaxNameLen    = 200
	MinEvery      = time.Second
	MaxCatchUpMax = 1000
	// DefaultCatchUpMax is CatchUpMax's default under MisfireCatchUp.
	DefaultCatchUpMax = 10
)

// MisfirePolicy says what the scheduler does with the slots it missed
// (the scheduler was down, or no scheduler held the lease, for longer
// than a period).
type MisfirePolicy string

const (
	// MisfireSkip is the default: it enqueues only the latest due slot, however
	// late, and skips the slots before it: after downtime the schedule runs
	// once, for the current period, as River's periodic jobs and Oban's
	// cron do not make up missed runs either.
	MisfireSkip MisfirePolicy = "skip"
	// MisfireCatchUp enqueues the latest CatchUpMax due slots, oldest
	// first, and skips those before them.
	MisfireCatchUp MisfirePolicy = "catch_up"
)

// Schedule is a periodic job: the job Job, enqueued once per slot. Exactly
// one of Cron and Every is set.
type Schedule struct {
	// Name identifies the schedule, and its jobs' idempotency keys:
	// "schedule:<name>:<slot, UTC RFC 3339>". Required, at most
	// MaxNameLen bytes, no control characters.
	Name string
	// Cron is a standard five-field cron expression (minute, hour, day of
	// month, month, day of week), as robfig/cron/v3's ParseStandard reads
	// it, or one of its descriptors @yearly, @annually, @monthly, @weekly,
	// @daily, @midnight and @hourly. "@every" (use Every) and a "TZ=" or
	// "CRON_TZ=" prefix (use TimeZone) are refused.
	Cron string
	// Every is the period of an interval schedule: a whole number of
	// seconds, at least MinEvery. Its slots are the multiples of Every
	// since the Unix epoch, so every process computes the same ones.
	Every time.Duration
	// TimeZone is the IANA zone Cron is read in, loaded with
	// time.LoadLocation. Default "UTC". With Every it must be "" or "UTC".
	TimeZone string
	// Job is the job each slot enqueues. Tenant and Kind are required;
	// IdempotencyKey and RequestHash must be empty (the scheduler sets
	// them per slot), and AvailableAt, DeadlineAt and Reuse unset.
	Job jobs.EnqueueParams
	// Jitter delays each slot's enqueue by an offset in [0, Jitter],
	// derived from a hash of Name and the slot, so every process computes
	// the same one: schedules on the same cron do not all enqueue at the
	// same instant. At most the schedule's shortest gap between slots.
	Jitter time.Duration
	// Misfire is the policy for missed slots. Default MisfireSkip.
	Misfire MisfirePolicy
	// CatchUpMax is how many missed slots MisfireCatchUp enqueues at most:
	// 1 to MaxCatchUpMax, 0 meaning DefaultCatchUpMax. Must be 0 with
	// MisfireSkip.
	CatchUpMax int
}

// ForKind returns the EnqueueParams of a job of the typed kind k with
// args, for Schedule.Job.
func ForKind[A, R any](k jobs.Kind[A, R], tenant string, args A, opts jobs.EnqueueOptions) (jobs.EnqueueParams, error) {
	p, err := k.Params(tenant, args, opts)
	if err != nil {
		return p, &llmqtype.ValidationError{Kind: ErrInvalid, Field: "Job.Payload", Problem: err.Error()}
	}
	return p, nil
}

// spec is a validated schedule's timing.
type spec struct {
	cron   cron.Schedule // nil: every
	every  time.Duration
	loc    *time.Location
	jitter time.Duration
	name   string
}

var cronParser = cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// reference is where the shortest gap between a cron's slots is measured,
// so that Jitter's check does not depend on when it runs.
var reference = time.Date(2001, time.January, 1, 0, 0, 0, 0, time.UTC)

func invalid(field, format string, args ...any) error {
	return &llmqtype.ValidationError{Kind: ErrInvalid, Field: field, Problem: fmt.Sprintf(format, args...)}
}

// normalize validates s and fills in its defaults.
func (s Schedule) normalize() (Schedule, *spec, error) {
	if problem := validate.Text(s.Name, true, MaxNameLen); problem != "" {
		return s, nil, invalid("Name", "%s", problem)
	}
	sp, err := parseSpec(s.Name, s.Cron, s.Every, s.TimeZone, s.Jitter)
	if err != nil {
		return s, nil, err
	}
	s.TimeZone = sp.loc.String()
	switch s.Misfire {
	case "", MisfireSkip:
		s.Misfire = MisfireSkip
		if s.CatchUpMax != 0 {
			return s, nil, invalid("CatchUpMax", "is %d; it applies to MisfireCatchUp only, leave it 0", s.CatchUpMax)
		}
	case MisfireCatchUp:
		if s.CatchUpMax < 0 || s.CatchUpMax > MaxCatchUpMax {
			return s, nil, invalid("CatchUpMax", "is %d; use 1 to %d, or 0 for %d", s.CatchUpMax, MaxCatchUpMax, DefaultCatchUpMax)
		}
		if s.CatchUpMax == 0 {
			s.CatchUpMax = DefaultCatchUpMax
		}
	default:
		return s, nil, invalid("Misfire", "%q: use MisfireSkip or MisfireCatchUp", s.Misfire)
	}
	j := s.Job
	switch {
	case validate.Text(j.Tenant, true, jobs.MaxTenantLen) != "":
		return s, nil, invalid("Job.Tenant", "%s", validate.Text(j.Tenant, true, jobs.MaxTenantLen))
	case validate.Text(j.Kind, true, jobs.MaxKindLen) != "":
		return s, nil, invalid("Job.Kind", "%s", validate.Text(j.Kind, true, jobs.MaxKindLen))
	case validate.Text(j.Queue, false, jobs.MaxQueueLen) != "":
		return s, nil, invalid("Job.Queue", "%s", validate.Text(j.Queue, false, jobs.MaxQueueLen))
	case validate.Text(j.GroupKey, false, jobs.MaxGroupKeyLen) != "":
		return s, nil, invalid("Job.GroupKey", "%s", validate.Text(j.GroupKey, false, jobs.MaxGroupKeyLen))
	case j.Priority < 0 || j.Priority > jobs.MaxPriority:
		return s, nil, invalid("Job.Priority", "is %d; use 0 to %d", j.Priority, jobs.MaxPriority)
	case j.MaxAttempts < 0 || j.MaxAttempts > jobs.MaxMaxAttempts:
		return s, nil, invalid("Job.MaxAttempts", "is %d; use 0 for the default or 1 to %d", j.MaxAttempts, jobs.MaxMaxAttempts)
	case j.EstimatedTokens < 0:
		return s, nil, invalid("Job.EstimatedTokens", "is %d; must not be negative", j.EstimatedTokens)
	case j.IdempotencyKey != "":
		return s, nil, invalid("Job.IdempotencyKey", "must be empty: the scheduler sets it to the slot's key")
	case j.RequestHash != "":
		return s, nil, invalid("Job.RequestHash", "must be empty: the scheduler sets it to the slot's")
	case !j.AvailableAt.IsZero():
		return s, nil, invalid("Job.AvailableAt", "must be unset: use Jitter to delay a slot")
	case !j.DeadlineAt.IsZero():
		return s, nil, invalid("Job.DeadlineAt", "must be unset: a fixed time does not repeat")
	case j.Reuse != nil:
		return s, nil, invalid("Job.Reuse", "must be nil: a schedule's jobs do not reuse answers")
	}
	if len(j.Payload) == 0 {
		s.Job.Payload = json.RawMessage(`{}`)
	} else if problem, _ := validate.JSON(j.Payload, jobs.DefaultMaxPayloadBytes); problem != "" {
		return s, nil, invalid("Job.Payload", "%s", problem)
	}
	return s, sp, nil
}

// Validate reports whether s is a schedule the package accepts: nil, or a
// *llmqtype.ValidationError naming the field (errors.Is ErrInvalid).
func (s Schedule) Validate() error {
	_, _, err := s.normalize()
	return err
}

// parseSpec validates a schedule's timing.
func parseSpec(name, cronExpr string, every time.Duration, zone string, jitter time.Duration) (*spec, error) {
	sp := &spec{name: name, jitter: jitter, every: every}
	switch {
	case cronExpr != "" && every != 0:
		return nil, invalid("Cron", "and Every are both set; use one")
	case cronExpr == "" && every == 0:
		return nil, invalid("Cron", "and Every are both empty; set one")
	case every != 0:
		if every < MinEvery || every%time.Second != 0 {
			return nil, invalid("Every", "is %s; use a whole number of seconds, at least %s", every, MinEvery)
		}
		if zone != "" && zone != "UTC" {
			return nil, invalid("TimeZone", "is %q; an Every schedule's slots are multiples of Every since the Unix epoch, leave it empty", zone)
		}
		sp.loc = time.UTC
	default:
		if problem := validate.Text(cronExpr, true, 200); problem != "" {
			return nil, invalid("Cron", "%s", problem)
		}
		trimmed := strings.TrimSpace(cronExpr)
		switch {
		case strings.HasPrefix(trimmed, "TZ=") || strings.HasPrefix(trimmed, "CRON_TZ="):
			return nil, invalid("Cron", "%q: set TimeZone instead of a TZ prefix", cronExpr)
		case strings.HasPrefix(trimmed, "@every"):
			return nil, invalid("Cron", "%q: use Every for an interval", cronExpr)
		}
		if zone == "" {
			zone = "UTC"
		}
		if strings.EqualFold(zone, "local") {
			return nil, invalid("TimeZone", "%q: name an IANA zone; Local differs between processes", zone)
		}
		loc, err := time.LoadLocation(zone)
		if err != nil {
			return nil, invalid("TimeZone", "%q: %v", zone, err)
		}
		sp.loc = loc
		sched, err := parseCron(trimmed, loc)
		if err != nil {
			return nil, invalid("Cron", "%q: %v", cronExpr, err)
		}
		if sched.Next(reference).IsZero() {
			return nil, invalid("Cron", "%q has no slot", cronExpr)
		}
		sp.cron = sched
	}
	if jitter < 0 {
		return nil, invalid("Jitter", "is %s; must not be negative", jitter)
	}
	if gap := sp.shortestGap(); jitter > gap {
		return nil, invalid("Jitter", "is %s; at most the shortest gap between slots, %s", jitter, gap)
	}
	return sp, nil
}

// parseCron parses a validated expression in loc; robfig's parser panics
// on nothing it is given, but a recover keeps a future version from
// taking a scheduler down.
func parseCron(expr string, loc *time.Location) (sched cron.Schedule, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%v", r)
		}
	}()
	sched, err = cronParser.Parse(expr)
	if err != nil {
		return nil, err
	}
	switch s := sched.(type) {
	case *cron.SpecSchedule:
		s.Location = loc
	default:
		return nil, fmt.Errorf("unsupported schedule %T", sched)
	}
	return sched, nil
}

// shortestGap is Every, or the shortest gap between a cron's first 64
// slots after reference.
func (sp *spec) shortestGap() time.Duration {
	if sp.cron == nil {
		return sp.every
	}
	gap := time.Duration(1<<63 - 1)
	t := sp.cron.Next(reference)
	for range 64 {
		n := sp.cron.Next(t)
		if n.IsZero() {
			break
		}
		gap = min(gap, n.Sub(t))
		t = n
	}
	return gap
}

// next is the first slot strictly after t, in UTC; zero if there is none.
func (sp *spec) next(t time.Time) time.Time {
	if sp.cron == nil {
		e := int64(sp.every / time.Second)
		u := t.Unix()
		k := u / e
		if u < 0 && u%e != 0 {
			k--
		}
		return time.Unix((k+1)*e, 0).UTC()
	}
	n := sp.cron.Next(t.Truncate(time.Second))
	if n.IsZero() {
		return n
	}
	return n.UTC()
}

// offset is the slot's jitter: a hash of the name and the slot, in
// [0, Jitter], whole milliseconds.
func (sp *spec) offset(slot time.Time) time.Duration {
	if sp.jitter <= 0 {
		return 0
	}
	h := fnv.New64a()
	h.Write([]byte(sp.name))
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(slot.Unix()))
	h.Write(b[:])
	ms := uint64(sp.jitter / time.Millisecond)
	return time.Duration(h.Sum64()%(ms+1)) * time.Millisecond
}

// SlotKey is the idempotency key of the schedule's job for slot.
func SlotKey(name string, slot time.Time) string {
	return "schedule:" + name + ":" + slot.UTC().Format(time.RFC3339)
}

// maxDueScan bounds how many slots one tick walks from next_slot: a cron
// firing every minute after two years of downtime stays within it.
const maxDueScan = 1 << 21

// due returns the slots from nextSlot on whose time (plus jitter) has come
// by now, after the misfire policy (the latest keep of them, oldest
// first), and the slot to wait for after them (zero: none).
func (sp *spec) due(nextSlot, now time.Time, keep int) (slots []time.Time, after time.Time) {
	slot := nextSlot.UTC()
	if sp.cron == nil && keep > 0 {
		// Jump over slots the policy would drop anyway.
		if skip := int64(now.Sub(slot)/sp.every) - int64(keep) - 1; skip > 0 {
			slot = slot.Add(time.Duration(skip) * sp.every)
		}
	}
	for range maxDueScan {
		if slot.IsZero() || slot.Add(sp.offset(slot)).After(now) {
			break
		}
		slots = append(slots, slot)
		if len(slots) > 2*keep {
			slots = append(slots[:0], slots[len(slots)-keep:]...)
		}
		slot = sp.next(slot)
	}
	if len(slots) > keep {
		slots = slots[len(slots)-keep:]
	}
	if !slot.IsZero() && !slot.Add(sp.offset(slot)).After(now) {
		// maxDueScan ran out: resume from the first slot after now.
		slot = sp.next(now)
	}
	return slots, slot
}
