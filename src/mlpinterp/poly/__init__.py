"""poly"""
