package kvfeedback

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// MaxMetricsBytes bounds a metrics page the parser reads.
const MaxMetricsBytes = 4 << 20

// Metrics are the samples of a metrics page, summed by metric name over
// their label sets (every series of a name, or only those whose
// model_name label is the one asked for).
type Metrics map[string]float64

// ErrMalformed is matched by every error ParseMetrics returns for a page
// that is not Prometheus text format.
var ErrMalformed = errors.New("kvfeedback: malformed metrics page")

// ParseMetrics reads a page in Prometheus text exposition format and
// sums each metric's samples over their label sets; with model set, only
// series labelled model_name="<model>" count. Comments and blank lines are
// skipped, a sample's timestamp is ignored. A line that is not a sample is
// an error naming it, and so is a page over MaxMetricsBytes.
func ParseMetrics(r io.Reader, model string) (Metrics, error) {
	limited := &io.LimitedReader{R: r, N: MaxMetricsBytes + 1}
	sc := bufio.NewScanner(limited)
	sc.Buffer(make([]byte, 64<<10), MaxMetricsBytes+1)
	out := Metrics{}
	for n := 1; sc.Scan(); n++ {
		if limited.N == 0 {
			return nil, fmt.Errorf("%w: more than %d bytes", ErrMalformed, MaxMetricsBytes)
		}
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		name, labels, value, err := parseSample(line)
		if err != nil {
			return nil, fmt.Errorf("%w: line %d: %w", ErrMalformed, n, err)
		}
		if model != "" && labels["model_name"] != model {
			continue
		}
		out[name] += value
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	if limited.N == 0 {
		return nil, fmt.Errorf("%w: more than %d bytes", ErrMalformed, MaxMetricsBytes)
	}
	return out, nil
}

// parseSample reads `name{label="value",...} value [timestamp]`.
func parseSample(line string) (name string, labels map[string]string, value float64, err error) {
	end := strings.IndexAny(line, "{ \t")
	if end <= 0 {
		return "", nil, 0, errors.New("no metric name and value")
	}
	name, rest := line[:end], line[end:]
	if !validName(name) {
		return "", nil, 0, fmt.Errorf("metric name %q", truncate(name))
	}
	if rest[0] == '{' {
		if labels, rest, err = parseLabels(rest[1:]); err != nil {
			return "", nil, 0, fmt.Errorf("metric %s: %w", name, err)
		}
	}
	fields := strings.Fields(rest)
	if len(fields) < 1 || len(fields) > 2 {
		return "", nil, 0, fmt.Errorf("metric %s: want a value and at most a timestamp, got %q", name, truncate(rest))
	}
	if value, err = strconv.ParseFloat(fields[0], 64); err != nil {
		return "", nil, 0, fmt.Errorf("metric %s: value %q is not a number", name, truncate(fields[0]))
	}
	return name, labels, value, nil
}

// parseLabels reads label pairs up to the closing brace and returns what
// follows it.
func parseLabels(s string) (map[string]string, string, error) {
	labels := map[string]string{}
	for {
		s = strings.TrimLeft(s, " \t")
		if strings.HasPrefix(s, "}") {
			return labels, s[1:], nil
		}
		eq := strings.IndexByte(s, '=')
		if eq <= 0 || !validName(strings.TrimSpace(s[:eq])) {
			return nil, "", errors.New("a label is not name=\"value\"")
		}
		key := strings.TrimSpace(s[:eq])
		s = strings.TrimLeft(s[eq+1:], " \t")
		if !strings.HasPrefix(s, `"`) {
			return nil, "", fmt.Errorf("label %s: the value is not quoted", key)
		}
		var b strings.Builder
		i := 1
		for ; i < len(s) && s[i] != '"'; i++ {
			if s[i] == '\\' && i+1 < len(s) {
				i++
				switch s[i] {
				case 'n':
					b.WriteByte('\n')
				default:
					b.WriteByte(s[i])
				}
				continue
			}
			b.WriteByte(s[i])
		}
		if i >= len(s) {
			return nil, "", fmt.Errorf("label %s: the value's quote is not closed", key)
		}
		labels[key] = b.String()
		s = strings.TrimLeft(s[i+1:], " \t")
		if strings.HasPrefix(s, ",") {
			s = s[1:]
		} else if !strings.HasPrefix(s, "}") {
			return nil, "", fmt.Errorf("label %s: expected ',' or '}'", key)
		}
	}
}

// validName reports a Prometheus metric or label name: letters, digits,
// '_' and ':' (vLLM's names have a colon), not starting with a digit.
func validName(s string) bool {
	for i, c := range s {
		switch {
		case c == '_' || c == ':' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z':
		case c >= '0' && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return s != ""
}

func truncate(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}
