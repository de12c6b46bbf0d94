# frozen_string_literal: true

module ApplicationCable
  class Connection < ActionCable::Connection::Base
  end
end
