package anthropic_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http/httptest"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/llmq/llmq/examples/fakeprovider"
	"github.com/llmq/llmq/jobs"
	"github.com/llmq/llmq/lease"
	llmqanthropic "github.com/llmq/llmq/provider/anthropic"
)

// A handler calling Anthropic with the adapter. The adapter's part is the
// Options call and the Call around the SDK call: the error Call returns
// already says how the attempt ended, here a snooze for a 429's wait.
func Example() {
	fake := fakeprovider.New(fakeprovider.Config{Scale: 15_000})
	provider := httptest.NewServer(fake)
	defer provider.Close()

	adapter, err := llmqanthropic.Options(llmqanthropic.Config{})
	if err != nil {
		panic(err)
	}
	client := anthropic.NewClient(append([]option.RequestOption{
		option.WithBaseURL(provider.URL), option.WithAPIKey("key"), option.WithHTTPClient(provider.Client()),
	}, adapter...)...)

	extract := lease.HandlerFunc(func(ctx context.Context, job *jobs.Job) (json.RawMessage, error) {
		var document string
		if err := json.Unmarshal(job.Payload, &document); err != nil {
			return nil, lease.NotSent(jobs.Permanent(err))
		}
		answer, err := llmqanthropic.Call(ctx, func(ctx context.Context) (*anthropic.Message, error) {
			return client.Messages.New(ctx, anthropic.MessageNewParams{
				Model:     anthropic.ModelClaudeSonnet5_5,
				MaxTokens: 1024,
				Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock(document))},
			})
		})
		if err != nil {
			return nil, err
		}
		return json.RawMessage(answer.Content[0].Text), nil
	})

	job := &jobs.Job{Payload: json.RawMessage(`"Supplier: Nordwind Papier GmbH\nTotal: 10.71\n"`)}
	result, err := extract.Work(context.Background(), job)
	var ex fakeprovider.Extraction
	if err == nil {
		err = json.Unmarshal(result, &ex)
	}
	fmt.Println(ex.SupplierName, ex.Total, err)

	fake.Storm(time.Minute) // the provider refuses calls for a minute
	_, err = extract.Work(context.Background(), job)
	var snooze *jobs.SnoozeError
	fmt.Println(errors.As(err, &snooze), snooze.After.Round(time.Second))
	// Output:
	// Nordwind Papier GmbH 10.71 <nil>
	// true 1m0s
}
