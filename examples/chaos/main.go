package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
)

func main() {
	var cfg Config
	role := flag.String("role", "", "internal: the child process role (worker or signals)")
	flag.DurationVar(&cfg.Duration, "duration", 0, "how long jobs arrive (default 3m)")
	flag.Float64Var(&cfg.Rate, "rate", 0, "job arrivals per second, independent of completions (default 3)")
	flag.IntVar(&cfg.Workers, "workers", 0, "worker processes (default 3)")
	flag.IntVar(&cfg.PerWorker, "per-worker", 0, "extractions in flight per worker process (default 4)")
	flag.StringVar(&cfg.Broker, "broker", "", "signal path broker: rabbitmq, kafka (kfake in this process) or postgres (default rabbitmq)")
	flag.Uint64Var(&cfg.Seed, "seed", 0, "seed of every random choice (default: random, printed)")
	flag.IntVar(&cfg.RPM, "rpm", 0, "the provider's requests per minute (default 200)")
	flag.DurationVar(&cfg.FaultEvery, "fault-every", 0, "mean gap between faults once each kind had one (default 8s)")
	flag.DurationVar(&cfg.Drain, "drain", 0, "how long to wait for the run to settle after arrivals end (default 2m)")
	flag.StringVar(&cfg.DatabaseURL, "database-url", os.Getenv("DATABASE_URL"), "PostgreSQL URL")
	flag.StringVar(&cfg.AMQPURL, "amqp-url", os.Getenv("AMQP_URL"), "RabbitMQ URL")
	flag.Parse()
	os.Exit(run(*role, cfg))
}

// run returns the exit code: 0, 1 for violations, 2 for a run that could
// not be carried out.
func run(role string, cfg Config) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if role != "" || os.Getenv(childEnv) != "" {
		if err := runChild(ctx, os.Stdin, os.Stdout, os.Stderr); err != nil {
			fmt.Fprintln(os.Stderr, "chaos child:", err)
			return 1
		}
		return 0
	}
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		return 2
	}
	cfg.Command = func(role string) *exec.Cmd {
		// The children outlive no run: the controller stops them, and
		// ctx's end kills any that remain.
		return exec.CommandContext(ctx, exe, "-role", role) //nolint:gosec // this binary, re-executed
	}
	report, err := Run(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		return 2
	}
	report.Print(os.Stdout)
	if len(report.Violations)+len(report.Defects) > 0 {
		return 1
	}
	return 0
}
