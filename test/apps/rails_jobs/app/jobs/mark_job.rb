# frozen_string_literal: true

class MarkJob < ActiveJob::Base
  def perform(path, note)
    File.write(path, "#{note}, performed by #{Process.pid}\n")
  end
end
