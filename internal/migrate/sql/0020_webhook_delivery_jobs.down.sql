DROP INDEX /*schema*/jobs_webhook_delivery_idx;
