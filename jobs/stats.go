package jobs

import "time"

// StatsWindow is how far back Stats counts finished jobs. Waiting and
// running jobs are counted whatever their age; a count of every finished
// job would read the whole history, which grows without bound where
// retention keeps it, so finished jobs are counted only when they finished
// within the window: per queue and state, what finished in the last
// minute. The whole history's size, per state, is the retention package's
// Status (exact while small, estimated from planner statistics beyond).
const StatsWindow = time.Minute
