# frozen_string_literal: true

# The boot-error test sets BB_BOOM: an initializer that fails, as a real one does when a
# credential or a service is missing.
raise "boom from an initializer" if ENV["BB_BOOM"]
