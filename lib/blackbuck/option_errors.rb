# frozen_string_literal: true

require "optparse"

module Blackbuck
  # What OptionParser refused, as one line, for both commands that parse options: `blackbuck`
  # (CLI) and `blackbuck status` (StatusClient). Its own file because the CLI loads StatusClient:
  # StatusClient asking the CLI for it would make the two load each other.
  module OptionErrors
    module_function

    # One line for what OptionParser refused: a misspelt long option gets the nearest one
    # ("invalid option: --wokers (did you mean --workers?)"), in place of OptionParser's own
    # suggestion on a second line without its dashes.
    def line(err, parser)
      first = err.message.lines.first.chomp
      return first unless err.is_a?(OptionParser::InvalidOption) && parser

      name = err.args.first.to_s[/\A--([^=]+)/, 1]
      near = name && spell_checker(parser.top.long.keys)&.correct(name)&.first
      near ? "#{first} (did you mean --#{near}?)" : first
    end

    def spell_checker(words)
      require "did_you_mean"
      DidYouMean::SpellChecker.new(dictionary: words)
    rescue LoadError # Ruby run with --disable-did_you_mean
      nil
    end
  end
end
