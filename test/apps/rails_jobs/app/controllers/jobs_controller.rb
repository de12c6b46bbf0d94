# frozen_string_literal: true

class JobsController < ActionController::API
  # POST /enqueue?path=FILE: a job that writes FILE, performed by bin/jobs.
  def enqueue
    job = MarkJob.perform_later(params.require(:path), "enqueued by #{Process.pid}")
    render plain: job.job_id
  end
end
