package inbox

import "time"

// SetSettleTimeout shortens the deadline of each delivery's settle, so
// that a test can wait one out.
func SetSettleTimeout(in *Ingress, d time.Duration) { in.settleTimeout = d }
