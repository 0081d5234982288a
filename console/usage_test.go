package console_test

import (
	"net/http"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/admission"
	"github.com/llmq/llmq/console"
)

// The usage table says how much of each tenant's cost was provider batch
// results, as the submitter records them (admission.BatchLedger).
func TestUsageShowsTheBatchCost(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	h := f.console(t, console.Config{})
	_, body := get(t, h, "/pools")
	require.Contains(t, body, "of which provider batches")
	require.Regexp(t, `<td class="clip" title="globex">globex</td>(<td class="n">[^<]*</td>){5}<td class="n">0.00</td>`, body, "no batch spend yet")

	ledger, err := admission.NewBatchLedger(f.schema)
	require.NoError(t, err)
	// openai-gpt's prices are $2.50 and $10 a million tokens; batches at
	// half: 400,000 input and 100,000 output tokens cost $0.50 + $0.50.
	require.NoError(t, ledger.Record(t.Context(), f.pool, "openai-gpt", []admission.BatchUsage{
		{Tenant: "globex", InputTokens: 400_000, OutputTokens: 100_000},
	}))
	code, body := get(t, h, "/pools")
	require.Equal(t, http.StatusOK, code)
	row := regexp.MustCompile(`<td class="clip" title="globex">globex</td>(<td class="n">[^<]*</td>){5}<td class="n">([^<]*)</td>`).FindStringSubmatch(body)
	require.NotNil(t, row, body)
	require.Equal(t, "1.00", row[2])
}
