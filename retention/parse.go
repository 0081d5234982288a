package retention

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// ParseRetention reads a retention as people write it: "never", a Go
// duration ("90m", "24h"), or whole days ("7d"). Zero and negative
// durations are refused: a retention is either a positive time or never.
func ParseRetention(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if s == "never" {
		return Never, nil
	}
	var d time.Duration
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.ParseInt(days, 10, 64)
		if err != nil || n > 36_500 || n < 0 {
			return 0, fmt.Errorf("retention %q: days must be a whole number of at most 36500", s)
		}
		d = time.Duration(n) * 24 * time.Hour
	} else {
		var err error
		if d, err = time.ParseDuration(s); err != nil {
			return 0, fmt.Errorf("retention %q: use a duration such as 90m, 24h or 7d, or never", s)
		}
	}
	if d <= 0 {
		return 0, fmt.Errorf("retention %q: must be positive (or never)", s)
	}
	return d, nil
}

// FormatRetention writes d as ParseRetention reads it.
func FormatRetention(d time.Duration) string {
	switch {
	case d == Never:
		return "never"
	case d >= 24*time.Hour && d%(24*time.Hour) == 0:
		return strconv.FormatInt(int64(d/(24*time.Hour)), 10) + "d"
	default:
		return d.String()
	}
}
