# frozen_string_literal: true

# Loaded into every Ruby process a test step starts (RUBYOPT=-W:deprecated -r this file, set by the
# matrix's lanes for 3.4 and 4.0): each deprecation warning Ruby gives about this checkout's own
# code (a chilled string mutated: a literal of a file without `frozen_string_literal: true`, or
# Symbol#to_s; ...) is appended to the file BLACKBUCK_DEPRECATIONS_LOG names. `rake test:deprecations`
# fails when that file has a line. Warnings about gems' code are left to their authors.
module BlackbuckDeprecations
  ROOT = File.expand_path("../..", __dir__)
  LOG = ENV.fetch("BLACKBUCK_DEPRECATIONS_LOG", nil)

  def warn(message, category: nil, **kw)
    if LOG && category == :deprecated && message.include?(ROOT) && !message.include?("/gems/")
      File.write(LOG, "#{Process.pid} #{message.chomp}\n", mode: "a")
    end
    super
  end
end

Warning[:deprecated] = true
Warning.singleton_class.prepend(BlackbuckDeprecations)
